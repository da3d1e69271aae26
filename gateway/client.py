"""A small Python client for the detection gateway, and its command line.

    python -m gateway.client IMAGE... --target localhost:50051 [--model NAME] [--stream]

prints one JSON object per image (the DetectionResult, or the error) per line.

From Python:

    with DetectionClient("localhost:50051") as client:
        result = client.detect(Path("street.jpg").read_bytes(), min_score=0.4)
        for d in result.detections:
            print(d.label, d.score, d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc

# Room for the gateway's default 32 MiB image limit plus the rest of the message.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


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
    spec = pb.ModelSpec(name=model)
    if version is not None and label is not None:
        raise ValueError("give a version or a label, not both")
    if version is not None:
        spec.version = version
    elif label is not None:
        spec.label = label
    return pb.DetectRequest(
        image=image,
        model=spec,
        min_score=min_score,
        max_detections=max_detections,
        request_id=request_id,
    )


def _box(box: pb.BoundingBox | pb.NormalizedBox) -> dict[str, Any]:
    return {"x_min": box.x_min, "y_min": box.y_min, "x_max": box.x_max, "y_max": box.y_max}


def result_to_dict(result: pb.DetectionResult) -> dict[str, Any]:
    """A DetectionResult as plain JSON-ready data, fields in a fixed, readable order."""
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


class DetectionClient:
    """Blocking client; one channel, reused for every call."""

    def __init__(
        self,
        target: str,
        *,
        timeout: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.timeout = timeout
        self._channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.max_receive_message_length", max_message_bytes),
            ],
        )
        self._stub = pb_grpc.DetectionServiceStub(self._channel)

    def detect(self, image: bytes, **fields: Any) -> pb.DetectionResult:
        """Runs detection on one encoded image. Raises grpc.RpcError on failure."""
        result: pb.DetectionResult = self._stub.Detect(
            make_request(image, **fields), timeout=self.timeout
        )
        return result

    def detect_stream(self, images: Iterable[bytes], **fields: Any) -> Iterator[pb.DetectionResult]:
        """Streams images (e.g. video frames); yields results in the same order."""
        requests = (make_request(image, **fields) for image in images)
        yield from self._stub.DetectStream(requests, timeout=self.timeout)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> DetectionClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.client", description="Run detection on image files."
    )
    parser.add_argument("images", nargs="+", type=Path, metavar="IMAGE")
    parser.add_argument("--target", default="localhost:50051", help="gateway host:port")
    parser.add_argument("--model", default="", help="model name (default: the gateway's)")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--version", type=int, help="model version")
    choice.add_argument("--label", help="model version label, e.g. stable")
    parser.add_argument("--min-score", type=float, default=0.0)
    parser.add_argument("--max-detections", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per call")
    parser.add_argument("--stream", action="store_true", help="send all images on one stream")
    args = parser.parse_args(argv)

    fields = {
        "model": args.model,
        "version": args.version,
        "label": args.label,
        "min_score": args.min_score,
        "max_detections": args.max_detections,
    }
    failed = 0
    with DetectionClient(args.target, timeout=args.timeout) as client:
        try:
            if args.stream:
                blobs = (path.read_bytes() for path in args.images)
                for path, result in zip(
                    args.images, client.detect_stream(blobs, **fields), strict=True
                ):
                    print(json.dumps({"image": str(path), **result_to_dict(result)}))
            else:
                for path in args.images:
                    try:
                        result = client.detect(path.read_bytes(), **fields)
                    except grpc.RpcError as e:
                        failed += 1
                        error = {"code": e.code().name, "message": e.details()}
                        print(json.dumps({"image": str(path), "error": error}))
                        continue
                    print(json.dumps({"image": str(path), **result_to_dict(result)}))
        except grpc.RpcError as e:
            print(json.dumps({"error": {"code": e.code().name, "message": e.details()}}))
            return 1
        except OSError as e:
            print(f"cannot read image: {e}", file=sys.stderr)
            return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
