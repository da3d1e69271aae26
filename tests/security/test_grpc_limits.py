"""What one gRPC connection may hold, enforced on the real gateway process against clients
that break each rule: more streams than allowed, a ping flood, metadata over the limit, and a
connection kept past its maximum age (asked to go away, its calls given the grace, then cut).

The raw HTTP/2 client (tests/security/h2raw.py) ignores the server's SETTINGS where a gRPC
library would obey them; gRPC's own Python client shows what well-behaved callers see.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hyperframe.frame import PingFrame

from gateway.flags import parse_settings
from gateway.frontends.grpc.server import server_options
from gateway.proto.detection.v1 import detection_pb2 as pb
from tests.security import h2raw
from tests.security.h2raw import RawConnection
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer

WATCH = "/grpc.health.v1.Health/Watch"
CHECK = "/grpc.health.v1.Health/Check"
DETECT_STREAM = "/detection.v1.DetectionService/DetectStream"
HEALTH_REQUEST = health_pb2.HealthCheckRequest(service="").SerializeToString()
SERVING = health_pb2.HealthCheckResponse.SERVING
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
STREAMS = 4
METADATA_BYTES = 4096


@pytest.fixture(scope="module")
def gateway(tfs: LocalServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    args = [
        f"--grpc-max-concurrent-streams={STREAMS}",
        f"--grpc-max-metadata-bytes={METADATA_BYTES}",
    ]
    with run_gateway(tfs.target, args, log_dir=tmp_path_factory.mktemp("grpc-limits")) as gw:
        yield gw


def check_status(gw: GatewayProcess, metadata: tuple[tuple[str, str], ...] = ()) -> int:
    with gw.channel() as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="")
        return int(stub.Check(request, timeout=30, metadata=metadata).status)


# --- settings -----------------------------------------------------------------------------


def test_connection_limits_come_from_flags_and_environment() -> None:
    settings = parse_settings(
        ["--grpc-max-concurrent-streams=7", "--grpc-max-connection-age=60"],
        environ={
            "GATEWAY_GRPC_MIN_PING_INTERVAL": "30",
            "GATEWAY_GRPC_MAX_CONNECTION_AGE": "999",  # the flag wins
            "GATEWAY_GRPC_MAX_CONNECTION_AGE_GRACE": "2.5",
            "GATEWAY_GRPC_MAX_METADATA_BYTES": "8192",
        },
    )
    options = dict(server_options(settings))
    assert options["grpc.max_concurrent_streams"] == 7
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == 30_000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.max_connection_age_ms"] == 60_000
    assert options["grpc.max_connection_age_grace_ms"] == 2_500
    assert options["grpc.max_metadata_size"] == options["grpc.absolute_max_metadata_size"] == 8192


def test_the_defaults_bound_every_connection_and_age_0_turns_the_age_off() -> None:
    options = dict(server_options(parse_settings([], environ={})))
    assert options["grpc.max_concurrent_streams"] == 100
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == 10_000
    assert options["grpc.max_connection_age_ms"] == 30 * 60_000
    assert options["grpc.max_connection_age_grace_ms"] == 5 * 60_000
    assert options["grpc.absolute_max_metadata_size"] == 16 * 1024
    unlimited = dict(server_options(parse_settings(["--grpc-max-connection-age=0"], environ={})))
    assert "grpc.max_connection_age_ms" not in unlimited


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--grpc-max-concurrent-streams=0"], "grpc-max-concurrent-streams must be at least 1"),
        (["--grpc-min-ping-interval=-1"], "grpc-min-ping-interval must be >= 0"),
        (["--grpc-max-connection-age-grace=-1"], "grpc-max-connection-age-grace must be >= 0"),
        (["--grpc-max-metadata-bytes=100"], "grpc-max-metadata-bytes must be at least 1024"),
    ],
)
def test_bad_connection_limits_are_refused_naming_them(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_settings(argv, environ={})
    assert named in capsys.readouterr().err


# --- streams per connection ---------------------------------------------------------------


def test_streams_beyond_the_limit_are_refused_and_the_others_served(
    gateway: GatewayProcess,
) -> None:
    with RawConnection(gateway.port).connect() as conn:
        conn.settle()
        assert conn.settings[h2raw.MAX_CONCURRENT_STREAMS] == STREAMS
        ids = [1 + 2 * i for i in range(STREAMS + 2)]
        # Long-lived calls (health watches), all opened at once: the client ignores the limit.
        conn.send(*(f for i in ids for f in conn.request_frames(i, WATCH, HEALTH_REQUEST)))
        allowed, extra = ids[:STREAMS], ids[STREAMS:]
        conn.until(
            lambda: (
                all(conn.streams[i].messages() for i in allowed)
                and all(conn.streams[i].ended for i in extra)
            ),
            "every stream was answered or refused",
        )
        for i in allowed:
            [message] = conn.streams[i].messages()
            assert health_pb2.HealthCheckResponse.FromString(message).status == SERVING
            assert not conn.streams[i].ended
        assert [conn.streams[i].reset for i in extra] == [h2raw.REFUSED_STREAM] * 2
        assert conn.goaways == []  # the connection itself is kept
    assert check_status(gateway) == SERVING


# --- keepalive pings ----------------------------------------------------------------------


def test_a_ping_is_answered_and_a_ping_flood_is_cut_with_too_many_pings(
    gateway: GatewayProcess,
) -> None:
    with RawConnection(gateway.port).connect() as conn:
        conn.settle()
        conn.ping(b"polite\x00\x00")
        conn.until(lambda: bool(conn.pings), "the PING ACK")
        assert conn.pings == [b"polite\x00\x00"]
        conn.call(1, CHECK, HEALTH_REQUEST)
        conn.until(lambda: conn.streams[1].ended, "the call's answer")
        assert conn.streams[1].grpc_status == 0 and conn.goaways == []
    with RawConnection(gateway.port).connect() as conn:
        conn.settle()
        conn.send(*(PingFrame(0, opaque_data=n.to_bytes(8, "big")) for n in range(10)))
        conn.until(lambda: bool(conn.goaways), "the GOAWAY")
        [goaway] = conn.goaways
        assert goaway.error_code == h2raw.ENHANCE_YOUR_CALM
        assert goaway.additional_data == b"too_many_pings"
        conn.until_closed()
    assert check_status(gateway) == SERVING  # the gateway serves everyone else


def test_a_grpc_client_pinging_too_often_loses_its_connection(gateway: GatewayProcess) -> None:
    eager = [
        ("grpc.keepalive_time_ms", 100),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    with grpc.insecure_channel(gateway.target, options=eager) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=120
        )
        statuses = []
        with pytest.raises(grpc.RpcError) as info:
            for response in watch:
                statuses.append(response.status)
    assert statuses == [SERVING]
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "Too many pings" in (info.value.details() or "")


# --- metadata size ------------------------------------------------------------------------


def test_metadata_over_the_limit_is_resource_exhausted(gateway: GatewayProcess) -> None:
    with RawConnection(gateway.port).connect() as conn:
        conn.settle()
        assert conn.settings[h2raw.MAX_HEADER_LIST_SIZE] == METADATA_BYTES
        conn.call(1, CHECK, HEALTH_REQUEST, metadata=[("x-filler", "a" * (METADATA_BYTES // 2))])
        conn.call(3, CHECK, HEALTH_REQUEST, metadata=[("x-filler", "a" * METADATA_BYTES)])
        conn.until(lambda: conn.streams[1].ended and conn.streams[3].ended, "both answers")
        assert conn.streams[1].grpc_status == 0
        assert conn.streams[3].grpc_status == RESOURCE_EXHAUSTED
        assert "metadata size exceeds hard limit" in conn.streams[3].grpc_message
        assert f"vs. {METADATA_BYTES}" in conn.streams[3].grpc_message
    with pytest.raises(grpc.RpcError) as info:
        check_status(gateway, metadata=(("x-filler", "a" * METADATA_BYTES),))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert check_status(gateway, metadata=(("x-filler", "a" * 1000),)) == SERVING


# --- connection age -----------------------------------------------------------------------


@pytest.fixture
def aging_gateway(
    tfs: LocalServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[GatewayProcess]:
    age, grace = request.param
    args = [f"--grpc-max-connection-age={age}", f"--grpc-max-connection-age-grace={grace}"]
    with run_gateway(tfs.target, args, log_dir=tmp_path) as gw:
        yield gw


@pytest.mark.parametrize("aging_gateway", [(1, 120)], indirect=True)
def test_past_its_age_a_connection_is_asked_to_go_away_and_its_calls_finish(
    aging_gateway: GatewayProcess, scene_png: bytes
) -> None:
    image = pb.DetectRequest(image=scene_png).SerializeToString()
    # The stream opens with the connection, before any age can pass.
    conn = RawConnection(aging_gateway.port)
    with conn.connect(*conn.request_frames(1, DETECT_STREAM, image, end=False)):
        conn.until(lambda: bool(conn.goaways), "the GOAWAY")
        [goaway] = conn.goaways
        assert (goaway.error_code, goaway.additional_data) == (h2raw.NO_ERROR, b"max_age")
        # Within the grace the call goes on: one more frame, answered, then the end.
        conn.message(1, image, end=True)
        conn.until(lambda: conn.streams[1].ended, "the stream's end")
        assert conn.streams[1].grpc_status == 0
        results = [pb.DetectionResult.FromString(m) for m in conn.streams[1].messages()]
        assert len(results) == 2 and results[0].detections == results[1].detections
        assert len(results[0].detections) > 0
        conn.until_closed()  # with no call left, the server closes the connection


@pytest.mark.parametrize("aging_gateway", [(1, 120)], indirect=True)
def test_a_grpc_client_reconnects_by_itself_after_the_age(aging_gateway: GatewayProcess) -> None:
    went_idle = threading.Event()
    seen: list[grpc.ChannelConnectivity] = []

    def changed(state: grpc.ChannelConnectivity) -> None:
        seen.append(state)
        if grpc.ChannelConnectivity.READY in seen and state == grpc.ChannelConnectivity.IDLE:
            went_idle.set()

    with aging_gateway.channel() as channel:
        channel.subscribe(changed, try_to_connect=True)
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="")
        assert stub.Check(request, timeout=30).status == SERVING
        assert went_idle.wait(120), f"the connection was never asked to go away: {seen}"
        assert stub.Check(request, timeout=30).status == SERVING  # on a new connection
        channel.unsubscribe(changed)


@pytest.mark.parametrize("aging_gateway", [(1, 0.5)], indirect=True)
def test_calls_still_open_after_the_grace_are_cut(aging_gateway: GatewayProcess) -> None:
    conn = RawConnection(aging_gateway.port)
    with conn.connect(*conn.request_frames(1, WATCH, HEALTH_REQUEST)):
        conn.until_closed()
        reasons = [(g.error_code, g.additional_data) for g in conn.goaways]
        assert reasons[0] == (h2raw.NO_ERROR, b"max_age")
        assert conn.streams[1].ended and conn.streams[1].messages()
    with aging_gateway.channel() as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=120
        )
        with pytest.raises(grpc.RpcError) as info:
            for _ in watch:
                pass
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
