"""A small Python client for the gateway's gRPC API, and its command line.

    python -m gateway.client IMAGE... --target localhost:50051 [--task classify] [--model NAME]
                             [--stream] [--tls --ca-file CA.pem ...] [--draw OUT.png]
    python -m gateway.client IMAGE... --http http://localhost:8080 [--task classify] ...

prints one JSON object per image (the result, or the error) per line; `--draw` also writes
the image with the boxes and labels (or top classes) drawn on it.

From Python:

    with DetectionClient("localhost:50051") as client:
        result = client.detect(Path("street.jpg").read_bytes(), min_score=0.4)
        for d in result.detections:
            print(d.label, d.score, d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max)

    with ClassificationClient("localhost:50051") as client:
        result = client.classify(Path("cat.jpg").read_bytes(), top_k=3)
        print([(c.label, c.score) for c in result.classes])
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from google.protobuf import json_format

from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc

# Room for the gateway's default 32 MiB image limit plus the rest of the message.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# --draw: boxes and label backgrounds in this colour, label text in white.
DRAW_COLOUR = (255, 0, 255)


@dataclass(frozen=True)
class TLS:
    """TLS to the gateway: a CA bundle (None: the system roots), a client certificate and
    key for mTLS, and the name to expect in the gateway's certificate."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | None) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )


def open_channel(
    target: str,
    tls: TLS | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> grpc.Channel:
    """A channel to the gateway with message limits for large images (and TLS if given)."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
    if tls is None:
        return grpc.insecure_channel(target, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.secure_channel(target, tls.credentials(), options=options)


def model_spec(
    model: str = "", version: int | None = None, label: str | None = None
) -> pb.ModelSpec:
    spec = pb.ModelSpec(name=model)
    if version is not None and label is not None:
        raise ValueError("give a version or a label, not both")
    if version is not None:
        spec.version = version
    elif label is not None:
        spec.label = label
    return spec


def make_request(
    image: bytes,
    *,
    model: str = "",
    version: int | None = None,
    label: str | None = None,
    min_score: float = 0.0,
    max_detections: int = 0,
    request_id: str = "",
) -> pb.DetectRequest:
    return pb.DetectRequest(
        image=image,
        model=model_spec(model, version, label),
        min_score=min_score,
        max_detections=max_detections,
        request_id=request_id,
    )


def make_classify_request(
    image: bytes,
    *,
    model: str = "",
    version: int | None = None,
    label: str | None = None,
    top_k: int = 0,
    min_score: float = 0.0,
    request_id: str = "",
) -> cpb.ClassifyRequest:
    return cpb.ClassifyRequest(
        image=image,
        model=model_spec(model, version, label),
        top_k=top_k,
        min_score=min_score,
        request_id=request_id,
    )


def _box(box: pb.BoundingBox | pb.NormalizedBox) -> dict[str, Any]:
    return {"x_min": box.x_min, "y_min": box.y_min, "x_max": box.x_max, "y_max": box.y_max}


def _error(result: pb.DetectionResult | cpb.ClassificationResult) -> dict[str, Any] | None:
    if not result.HasField("error"):
        return None
    code = grpc.StatusCode.UNKNOWN
    for candidate in grpc.StatusCode:
        if candidate.value[0] == result.error.code:
            code = candidate
    return {"code": code.name, "message": result.error.message}


def result_to_dict(result: pb.DetectionResult) -> dict[str, Any]:
    """A DetectionResult as plain JSON-ready data, fields in a fixed, readable order."""
    error = _error(result)
    if error is not None:
        return {"request_id": result.request_id, "error": error}
    return {
        "request_id": result.request_id,
        "model": {"name": result.model.name, "version": result.model.version},
        "image_width": result.image_width,
        "image_height": result.image_height,
        "detections": [
            {
                "class_id": d.class_id,
                "label": d.label,
                "score": round(d.score, 4),
                "box": _box(d.box),
                "normalized_box": {k: round(v, 5) for k, v in _box(d.normalized_box).items()},
            }
            for d in result.detections
        ],
    }


def classification_to_dict(result: cpb.ClassificationResult) -> dict[str, Any]:
    """A ClassificationResult as plain JSON-ready data."""
    error = _error(result)
    if error is not None:
        return {"request_id": result.request_id, "error": error}
    return {
        "request_id": result.request_id,
        "model": {"name": result.model.name, "version": result.model.version},
        "image_width": result.image_width,
        "image_height": result.image_height,
        "classes": [
            {"class_id": c.class_id, "label": c.label, "score": round(c.score, 4)}
            for c in result.classes
        ],
    }


class _Client:
    def __init__(
        self,
        target: str,
        *,
        timeout: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls: TLS | None = None,
    ) -> None:
        self.timeout = timeout
        self._channel = open_channel(target, tls, max_message_bytes)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class DetectionClient(_Client):
    """Blocking detection client; one channel, reused for every call."""

    def __init__(self, target: str, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self._stub = pb_grpc.DetectionServiceStub(self._channel)

    def detect(self, image: bytes, **fields: Any) -> pb.DetectionResult:
        """Runs detection on one encoded image. Raises grpc.RpcError on failure."""
        result: pb.DetectionResult = self._stub.Detect(
            make_request(image, **fields), timeout=self.timeout
        )
        return result

    def detect_stream(self, images: Iterable[bytes], **fields: Any) -> Iterator[pb.DetectionResult]:
        """Streams images (e.g. video frames); yields results in the same order (a result
        with `error` set for an image that failed on its own)."""
        requests = (make_request(image, **fields) for image in images)
        yield from self._stub.DetectStream(requests, timeout=self.timeout)


class ClassificationClient(_Client):
    """Blocking classification client; one channel, reused for every call."""

    def __init__(self, target: str, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self._stub = cpb_grpc.ClassificationServiceStub(self._channel)

    def classify(self, image: bytes, **fields: Any) -> cpb.ClassificationResult:
        """Classifies one encoded image. Raises grpc.RpcError on failure."""
        result: cpb.ClassificationResult = self._stub.Classify(
            make_classify_request(image, **fields), timeout=self.timeout
        )
        return result

    def classify_stream(
        self, images: Iterable[bytes], **fields: Any
    ) -> Iterator[cpb.ClassificationResult]:
        """Streams images; yields results in the same order."""
        requests = (make_classify_request(image, **fields) for image in images)
        yield from self._stub.ClassifyStream(requests, timeout=self.timeout)


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """--tls, --ca-file, --cert-file, --key-file, --server-name (shared with other CLIs)."""
    group = parser.add_argument_group("TLS to the gateway")
    group.add_argument("--tls", action="store_true", help="use TLS (implied by the files)")
    group.add_argument("--ca-file", help="PEM CA bundle (default: the system roots)")
    group.add_argument("--cert-file", help="PEM client certificate chain (mTLS)")
    group.add_argument("--key-file", help="PEM private key of the client certificate")
    group.add_argument("--server-name", help="name expected in the gateway's certificate")


def tls_from_args(args: argparse.Namespace) -> TLS | None:
    if bool(args.cert_file) != bool(args.key_file):
        raise SystemExit("--cert-file and --key-file go together")
    if not (args.tls or args.ca_file or args.cert_file):
        return None
    return TLS(args.ca_file, args.cert_file, args.key_file, args.server_name)


class HttpClient:
    """The gateway's HTTP door with urllib: the raw image as the body, options in the query,
    the proto3 JSON result parsed back into the same messages as the gRPC clients return."""

    def __init__(self, url: str, *, timeout: float = 30.0, task: str = "detect") -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.task = task

    def path(self, model: str, version: int | None, label: str | None) -> str:
        """The route: /v1/models/{model}[/versions/{n}|/labels/{l}]:{task}, or /invocations
        (the gateway's default model and its task) when no model is named."""
        if not model:
            if version is not None or label is not None:
                raise ValueError("--version and --label need --model over HTTP")
            return "/invocations"
        path = "/v1/models/" + urllib.parse.quote(model, safe="")
        if version is not None:
            path += f"/versions/{version}"
        elif label is not None:
            path += "/labels/" + urllib.parse.quote(label, safe="")
        return f"{path}:{self.task}"

    def call(
        self,
        image: bytes,
        *,
        model: str = "",
        version: int | None = None,
        label: str | None = None,
        **options: Any,
    ) -> pb.DetectionResult | cpb.ClassificationResult:
        """One image; raises HttpCallError with the gateway's error code and message."""
        query = urllib.parse.urlencode({k: v for k, v in options.items() if v})
        url = self.url + self.path(model, version, label) + (f"?{query}" if query else "")
        request = urllib.request.Request(
            url,
            data=image,
            headers={"Content-Type": "application/octet-stream", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as e:
            raise HttpCallError.from_response(e.code, e.read()) from None
        result: pb.DetectionResult | cpb.ClassificationResult = (
            pb.DetectionResult() if self.task == "detect" else cpb.ClassificationResult()
        )
        return json_format.Parse(body, result, ignore_unknown_fields=True)


class HttpCallError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message

    @classmethod
    def from_response(cls, status: int, body: bytes) -> HttpCallError:
        try:
            error = json.loads(body)["error"]
            return cls(status, str(error["code"]), str(error["message"]))
        except (ValueError, KeyError, TypeError):
            return cls(status, "UNKNOWN", f"HTTP {status}: {body[:200]!r}")


def draw(image: bytes, result: dict[str, Any], out: Path) -> None:
    """Writes the image (as a viewer shows it: EXIF orientation applied, like the gateway's
    pixels) with the detections' boxes, labels and scores, or the top classes, drawn on it."""
    from PIL import Image, ImageDraw, ImageFont, ImageOps

    picture = ImageOps.exif_transpose(Image.open(io.BytesIO(image))).convert("RGB")
    canvas = ImageDraw.Draw(picture)
    size = max(12, picture.width // 50)
    font = ImageFont.load_default(size)
    line = max(2, picture.width // 320)

    def label(text: str, x: int, y: int) -> None:
        left, top, right, bottom = canvas.textbbox((0, 0), text, font=font)
        height = bottom - top + 4
        top_y = y - height if y - height >= 0 else y
        canvas.rectangle((x, top_y, x + right - left + 6, top_y + height), fill=DRAW_COLOUR)
        canvas.text((x + 3, top_y + 2 - top), text, fill="white", font=font)

    for d in result.get("detections", []):
        box = d["box"]
        canvas.rectangle(
            (box["x_min"], box["y_min"], box["x_max"] - 1, box["y_max"] - 1),
            outline=DRAW_COLOUR,
            width=line,
        )
    for d in result.get("detections", []):
        label(f"{d['label']} {d['score']:.2f}", d["box"]["x_min"], d["box"]["y_min"])
    for rank, c in enumerate(result.get("classes", [])):
        label(f"{c['label']} {c['score']:.3f}", 0, rank * (size + 8))
    out.parent.mkdir(parents=True, exist_ok=True)
    picture.save(out)


def draw_path(out: Path, index: int, count: int) -> Path:
    """OUT.png for one image; OUT-0.png, OUT-1.png, ... for several."""
    return out if count == 1 else out.with_name(f"{out.stem}-{index}{out.suffix}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.client", description="Run detection or classification on images."
    )
    parser.add_argument("images", nargs="+", type=Path, metavar="IMAGE")
    parser.add_argument("--target", default="localhost:50051", help="gateway host:port (gRPC)")
    parser.add_argument(
        "--http",
        metavar="URL",
        help="call the HTTP door at URL (e.g. http://localhost:8080) instead of gRPC",
    )
    parser.add_argument("--task", choices=("detect", "classify"), default="detect")
    parser.add_argument("--model", default="", help="model name (default: the gateway's)")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--version", type=int, help="model version")
    choice.add_argument("--label", help="model version label, e.g. stable")
    parser.add_argument("--min-score", type=float, default=0.0)
    parser.add_argument("--max-detections", type=int, default=0, help="detect only")
    parser.add_argument("--top-k", type=int, default=0, help="classify only")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per call")
    parser.add_argument("--stream", action="store_true", help="send all images on one stream")
    parser.add_argument(
        "--draw",
        type=Path,
        metavar="OUT.png",
        help="write the image with its boxes and labels (or top classes) drawn; with several "
        "images OUT-0.png, OUT-1.png, ...",
    )
    add_tls_arguments(parser)
    args = parser.parse_args(argv)
    if args.http and args.stream:
        parser.error("--stream is gRPC only (the HTTP door takes one image per request)")

    fields: dict[str, Any] = {
        "model": args.model,
        "version": args.version,
        "label": args.label,
        "min_score": args.min_score,
    }
    if args.task == "detect":
        fields["max_detections"] = args.max_detections
    else:
        fields["top_k"] = args.top_k
    to_dict = result_to_dict if args.task == "detect" else classification_to_dict

    def report(index: int, path: Path, image: bytes, result: Any) -> bool:
        line = to_dict(result)
        print(json.dumps({"image": str(path), **line}))
        if args.draw and "error" not in line:
            draw(image, line, draw_path(args.draw, index, len(args.images)))
        return "error" in line

    if args.http:
        return _main_http(args, fields, report)
    client: DetectionClient | ClassificationClient
    if args.task == "detect":
        client = DetectionClient(args.target, timeout=args.timeout, tls=tls_from_args(args))
        one, many = client.detect, client.detect_stream
    else:
        client = ClassificationClient(args.target, timeout=args.timeout, tls=tls_from_args(args))
        one, many = client.classify, client.classify_stream  # type: ignore[assignment]
    failed = 0
    with client:
        try:
            if args.stream:
                blobs = [path.read_bytes() for path in args.images]
                results = many(iter(blobs), **fields)
                for index, (path, image, result) in enumerate(
                    zip(args.images, blobs, results, strict=True)
                ):
                    failed += report(index, path, image, result)
            else:
                for index, path in enumerate(args.images):
                    image = path.read_bytes()
                    try:
                        result = one(image, **fields)
                    except grpc.RpcError as e:
                        failed += 1
                        error = {"code": e.code().name, "message": e.details()}
                        print(json.dumps({"image": str(path), "error": error}))
                        continue
                    failed += report(index, path, image, result)
        except grpc.RpcError as e:
            print(json.dumps({"error": {"code": e.code().name, "message": e.details()}}))
            return 1
        except OSError as e:
            print(f"cannot read image: {e}", file=sys.stderr)
            return 2
    return 1 if failed else 0


def _main_http(
    args: argparse.Namespace,
    fields: dict[str, Any],
    report: Callable[[int, Path, bytes, Any], bool],
) -> int:
    client = HttpClient(args.http, timeout=args.timeout, task=args.task)
    failed = 0
    for index, path in enumerate(args.images):
        try:
            image = path.read_bytes()
        except OSError as e:
            print(f"cannot read image: {e}", file=sys.stderr)
            return 2
        try:
            result = client.call(image, **fields)
        except HttpCallError as e:
            failed += 1
            error = {"code": e.code, "message": e.message, "http_status": e.status}
            print(json.dumps({"image": str(path), "error": error}))
            continue
        except (OSError, ValueError) as e:  # connection refused, bad URL
            print(
                json.dumps(
                    {"image": str(path), "error": {"code": "UNAVAILABLE", "message": str(e)}}
                )
            )
            return 1
        failed += report(index, path, image, result)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
