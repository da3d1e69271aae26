"""A raw HTTP/2 client for tests that break gRPC's connection rules on purpose.

gRPC client libraries obey the server's SETTINGS and their own keepalive floors, so they
cannot show what the server does to a client that does not. This one sends exactly the
frames a test writes (hyperframe builds them, hpack encodes headers), reads the server's
frames one by one, and remembers the server's settings and each stream's decoded headers.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hpack import Decoder, Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# HTTP/2 error codes (RFC 9113, section 7).
NO_ERROR = 0x0
REFUSED_STREAM = 0x7
ENHANCE_YOUR_CALM = 0xB
# HTTP/2 settings (RFC 9113, section 6.5.2).
MAX_CONCURRENT_STREAMS = 0x3
MAX_HEADER_LIST_SIZE = 0x6


def grpc_message(payload: bytes) -> bytes:
    """One gRPC length-prefixed message (uncompressed)."""
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


@dataclass
class Stream:
    headers: list[dict[str, str]] = field(default_factory=list)  # response headers, trailers
    data: bytes = b""
    ended: bool = False
    reset: int | None = None  # RST_STREAM's error code

    def messages(self) -> list[bytes]:
        """The gRPC messages received so far."""
        out, rest = [], self.data
        while len(rest) >= 5:
            size = int.from_bytes(rest[1:5], "big")
            out.append(rest[5 : 5 + size])
            rest = rest[5 + size :]
        return out

    @property
    def grpc_status(self) -> int | None:
        for block in reversed(self.headers):
            if "grpc-status" in block:
                return int(block["grpc-status"])
        return None

    @property
    def grpc_message(self) -> str:
        for block in reversed(self.headers):
            if "grpc-message" in block:
                return block["grpc-message"]
        return ""


class RawConnection:
    """One plaintext HTTP/2 connection to 127.0.0.1:`port` (opened by connect()).

    Every read waits at most `timeout` seconds, so a server that never answers fails the test
    instead of hanging it.
    """

    def __init__(self, port: int, timeout: float = 60.0) -> None:
        self.port, self.timeout = port, timeout
        self.encoder, self.decoder = Encoder(), Decoder()
        self.settings: dict[int, int] = {}  # the server's
        self.settings_acked = False  # the server has acknowledged ours
        self.streams: dict[int, Stream] = {}
        self.goaways: list[GoAwayFrame] = []
        self.pings: list[bytes] = []  # opaque data of the PING ACKs received
        self.closed = False
        self._buffer = b""
        self.sock: socket.socket | None = None

    def connect(self, *first: Frame) -> RawConnection:
        """Connects and sends the preface, our (empty) SETTINGS and `first` in one write, so
        the server reads `first` with the connection's opening bytes."""
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
        self.sock.sendall(PREFACE + b"".join(f.serialize() for f in (SettingsFrame(0), *first)))
        return self

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- sending --------------------------------------------------------------------------

    def send(self, *frames: Frame) -> None:
        assert self.sock is not None, "connect() first"
        self.sock.sendall(b"".join(f.serialize() for f in frames))

    def request_frames(
        self,
        stream_id: int,
        path: str,
        message: bytes | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        end: bool = True,
    ) -> list[Frame]:
        """HEADERS for a gRPC call to `path`, then its message (if any) in a DATA frame;
        `end` half-closes the stream after it."""
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *metadata,
        ]
        frames: list[Frame] = [HeadersFrame(stream_id, self.encoder.encode(headers))]
        frames[0].flags.add("END_HEADERS")
        if message is not None:
            frames.append(DataFrame(stream_id, grpc_message(message)))
        if end:
            frames[-1].flags.add("END_STREAM")
        self.streams.setdefault(stream_id, Stream())
        return frames

    def call(
        self,
        stream_id: int,
        path: str,
        message: bytes | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        end: bool = True,
    ) -> None:
        self.send(*self.request_frames(stream_id, path, message, metadata, end))

    def message(self, stream_id: int, payload: bytes, end: bool = False) -> None:
        """One more gRPC message on an open stream."""
        frame = DataFrame(stream_id, grpc_message(payload))
        if end:
            frame.flags.add("END_STREAM")
        self.send(frame)

    def ping(self, data: bytes = bytes(8)) -> None:
        self.send(PingFrame(0, opaque_data=data))

    # --- receiving ------------------------------------------------------------------------

    def next_frame(self) -> Frame | None:
        """The server's next frame (bookkept), or None once it has closed the connection."""
        while True:
            if len(self._buffer) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(self._buffer[:9]))
                if len(self._buffer) >= 9 + length:
                    frame.parse_body(memoryview(self._buffer[9 : 9 + length]))
                    self._buffer = self._buffer[9 + length :]
                    self._note(frame)
                    return frame
            assert self.sock is not None, "connect() first"
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                return None
            self._buffer += data

    def _note(self, frame: Frame) -> None:
        if isinstance(frame, SettingsFrame):
            if "ACK" in frame.flags:
                self.settings_acked = True
            else:
                self.settings.update(frame.settings)
                ack = SettingsFrame(0)
                ack.flags.add("ACK")
                self.send(ack)
        elif isinstance(frame, HeadersFrame | ContinuationFrame):
            assert "END_HEADERS" in frame.flags, "header blocks split over frames not handled"
            stream = self.streams.setdefault(frame.stream_id, Stream())
            stream.headers.append(dict(self.decoder.decode(frame.data)))
            stream.ended |= "END_STREAM" in frame.flags
        elif isinstance(frame, DataFrame):
            stream = self.streams.setdefault(frame.stream_id, Stream())
            stream.data += frame.data
            stream.ended |= "END_STREAM" in frame.flags
        elif isinstance(frame, RstStreamFrame):
            stream = self.streams.setdefault(frame.stream_id, Stream())
            stream.reset, stream.ended = frame.error_code, True
        elif isinstance(frame, GoAwayFrame):
            self.goaways.append(frame)
        elif isinstance(frame, PingFrame):
            if "ACK" in frame.flags:
                self.pings.append(frame.opaque_data)
            else:  # every HTTP/2 peer answers a PING (gRPC's graceful GOAWAY waits for it)
                ack = PingFrame(0, opaque_data=frame.opaque_data)
                ack.flags.add("ACK")
                self.send(ack)

    def until(self, done: Callable[[], bool], what: str) -> None:
        """Reads frames until `done()` holds; fails if the connection closes first."""
        while not done():
            if self.next_frame() is None:
                raise AssertionError(f"the connection closed before {what}")

    def until_closed(self) -> None:
        while self.next_frame() is not None:
            pass

    def settle(self) -> None:
        """Until the server's settings are in (and acknowledged) and ours are acknowledged:
        from then on the server holds this connection to its limits."""
        self.until(lambda: bool(self.settings) and self.settings_acked, "the SETTINGS exchange")
