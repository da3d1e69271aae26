"""End to end over real sockets: client -> gateway -> local TF Serving -> reference models.

One local TF Serving-compatible server and one gateway serve the whole module: `detector`
(versions 1 and 2, labels stable=1 and canary=2), `detector_encoded`, and `embedder`, a
SavedModel with a signature no task can use (a float vector in, probabilities out).
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import json_format
from PIL import Image

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfswire
from gateway.upstream.client import PREDICT
from serving import scenes
from serving.export import export_models
from tests.support import tools
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import CHANNEL_OPTIONS, GatewayProcess, run_gateway
from tests.support.localserver import closed_port, run_local_server

MODELS = ("detector", "detector_encoded")
MAX_PIXELS = 4_000_000
MAX_IMAGE_BYTES = 8 * 1024 * 1024
STREAM_WINDOW = 2


def _save_classifier(path: Path) -> None:
    import tensorflow as tf

    class Classifier(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="features")])
        def __call__(self, features: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"probabilities": tf.nn.softmax(features)}

    module = Classifier()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})


@pytest.fixture(scope="module")
def model_config(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("e2e-models")
    shutil.copytree(model_repo, root, dirs_exist_ok=True)
    export_models(root, version=2, names=["detector"])
    _save_classifier(root / "embedder" / "1")
    config = root / "models.config"
    config.write_text(
        f"""
        model_config_list {{
          config {{
            name: 'detector' base_path: '{root / "detector"}' model_platform: 'tensorflow'
            model_version_policy {{ all {{}} }}
            version_labels {{ key: 'stable' value: 1 }}
            version_labels {{ key: 'canary' value: 2 }}
          }}
          config {{
            name: 'detector_encoded' base_path: '{root / "detector_encoded"}'
            model_platform: 'tensorflow'
          }}
          config {{
            name: 'embedder' base_path: '{root / "embedder"}' model_platform: 'tensorflow'
          }}
        }}
        """
    )
    return config


def label_map_flag(model_config: Path) -> str:
    root = model_config.parent
    return "--label-maps=" + ",".join(
        f"{m}={root / m / '1' / 'assets.extra' / 'label_map.pbtxt'}" for m in MODELS
    )


@pytest.fixture(scope="module")
def tfs(model_config: Path) -> Iterator[object]:
    args = [f"--model_config_file={model_config}", "--allow_version_labels_for_unavailable_models"]
    with run_local_server(args) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(tfs, model_config: Path, tmp_path_factory) -> Iterator[GatewayProcess]:
    args = [
        label_map_flag(model_config),
        f"--max-pixels={MAX_PIXELS}",
        f"--max-image-bytes={MAX_IMAGE_BYTES}",
        f"--stream-window={STREAM_WINDOW}",
    ]
    with run_gateway(tfs.target, args, log_dir=tmp_path_factory.mktemp("logs")) as gw:
        yield gw


@pytest.fixture(scope="module")
def stub(gateway: GatewayProcess):
    with gateway.channel() as channel:
        yield gateway.stub(channel)


def detect(stub, image: bytes, timeout: float = 60, **fields) -> pb.DetectionResult:
    model = fields.pop("model", None)
    request = pb.DetectRequest(image=image, **fields)
    if model is not None:
        request.model.CopyFrom(model)
    return stub.Detect(request, timeout=timeout)


def rpc_error(stub, image: bytes, **fields) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        detect(stub, image, **fields)
    return info.value


def assert_matches(result: pb.DetectionResult, scene: scenes.Scene, tolerance: int = 1) -> None:
    """Every painted rectangle found with its class and a box within `tolerance` px; nothing
    else scores 0.5 or more."""
    assert (result.image_width, result.image_height) == (scene.width, scene.height)
    unmatched = list(result.detections)
    for truth in scene.boxes:
        match = next(
            (
                d
                for d in unmatched
                if d.class_id == truth.class_id
                and abs(d.box.x_min - truth.x_min) <= tolerance
                and abs(d.box.y_min - truth.y_min) <= tolerance
                and abs(d.box.x_max - truth.x_max) <= tolerance
                and abs(d.box.y_max - truth.y_max) <= tolerance
            ),
            None,
        )
        assert match is not None, f"{truth} not found in {result.detections}"
        assert match.label == truth.label.replace("_", " ")
        unmatched.remove(match)
    assert [d for d in unmatched if d.score >= 0.5] == []
    scores = [d.score for d in result.detections]
    assert scores == sorted(scores, reverse=True)


def scene_for(seed: int, width: int = 480, height: int = 360, rects: int = 6, noise: float = 4.0):
    rng = np.random.default_rng(seed)
    return scenes.generate_scene(rng, width, height, rects, noise_sigma=noise)


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def model(name: str, **choice) -> pb.ModelSpec:
    return pb.ModelSpec(name=name, **choice)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(
    ("seed", "width", "height", "rects", "fmt"),
    [
        (1, 640, 480, 8, "PNG"),
        (2, 640, 480, 8, "JPEG"),
        (3, 97, 211, 2, "PNG"),
        (4, 1500, 900, 12, "JPEG"),
        (5, 300, 300, 0, "PNG"),
    ],
)
def test_generated_scenes_give_exact_boxes_and_labels(stub, name, seed, width, height, rects, fmt):
    scene = scene_for(seed, width, height, rects)
    result = detect(stub, scenes.encode(scene.pixels, fmt), model=model(name))
    assert_matches(result, scene)
    assert result.model.name == name
    assert result.request_id


# Inverse of the transposition ImageOps.exif_transpose applies for each orientation.
_UNDO = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_rotated_jpeg_boxes_are_in_the_displayed_image(stub, name, orientation):
    scene = scene_for(10 + orientation, 400, 260, 5, noise=0)
    shown = Image.fromarray(scene.pixels)
    undo = _UNDO[orientation]
    stored = shown if undo is None else shown.transpose(undo)
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(stored, "JPEG", quality=95, exif=exif.tobytes())
    # The file really is shown as the scene by a viewer that honours EXIF.
    from PIL import ImageOps

    assert ImageOps.exif_transpose(Image.open(io.BytesIO(data))).size == shown.size
    assert_matches(detect(stub, data, model=model(name)), scene)


def _variants(scene: scenes.Scene) -> dict[str, bytes]:
    rgb = Image.fromarray(scene.pixels)
    rgba = rgb.convert("RGBA")
    rgba.putalpha(200)
    return {
        "png_rgba": encode(rgba, "PNG"),
        "png_palette": encode(rgb.quantize(colors=16, method=Image.Quantize.MEDIANCUT), "PNG"),
        "gif": encode(rgb.quantize(colors=16, method=Image.Quantize.MEDIANCUT), "GIF"),
        "jpeg_cmyk": encode(rgb.convert("CMYK"), "JPEG", quality=95),
        "bmp": encode(rgb, "BMP"),
        "webp_lossless": encode(rgb, "WEBP", lossless=True),
        "tiff": encode(rgb, "TIFF"),
    }


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(
    "variant", ["png_rgba", "png_palette", "gif", "jpeg_cmyk", "bmp", "webp_lossless", "tiff"]
)
def test_formats_and_colour_modes_are_converted_to_rgb(stub, name, variant):
    scene = scene_for(30, 320, 240, 5, noise=0)
    assert_matches(detect(stub, _variants(scene)[variant], model=model(name)), scene)


# JPEG encodings the gateway's libjpeg-turbo path must decode as Pillow did (the exact boxes
# are the check); CMYK takes Pillow's path and is covered above.
_ODD_JPEGS = {
    "subsampling_420": {"quality": 92, "subsampling": 2},
    "subsampling_444": {"quality": 92, "subsampling": 0},
    "progressive": {"quality": 92, "progressive": True},
    "restart_markers": {"quality": 92, "restart_marker_blocks": 4},
    "rgb_without_ycbcr": {"quality": 92, "keep_rgb": True, "subsampling": 0},
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("variant", _ODD_JPEGS)
def test_odd_jpeg_encodings_give_the_exact_boxes(stub, name, variant):
    scene = scene_for(40, 333, 251, 5)
    data = encode(Image.fromarray(scene.pixels), "JPEG", **_ODD_JPEGS[variant])
    assert_matches(detect(stub, data, model=model(name)), scene)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_grayscale_image_is_accepted_and_has_no_coloured_boxes(stub, name, fmt):
    scene = scene_for(31, 320, 240, 5, noise=0)
    gray = encode(Image.fromarray(scene.pixels).convert("L"), fmt)
    result = detect(stub, gray, model=model(name), min_score=0.01)
    assert (result.image_width, result.image_height) == (320, 240)
    assert [d for d in result.detections if d.score >= 0.5] == []


def test_min_score_and_max_detections(stub):
    scene = scene_for(40, 640, 480, 10, noise=10)
    data = scenes.encode(scene.pixels, "JPEG")
    everything = detect(stub, data, min_score=0.01, max_detections=100)
    assert len(everything.detections) >= len(scene.boxes)
    top3 = detect(stub, data, min_score=0.01, max_detections=3)
    assert list(top3.detections) == list(everything.detections[:3])
    cut = everything.detections[len(scene.boxes) // 2].score
    above = detect(stub, data, min_score=float(cut), max_detections=100)
    assert all(d.score >= cut for d in above.detections)
    assert len(above.detections) == sum(d.score >= cut for d in everything.detections)


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        (pb.ModelSpec(name="detector"), 2),
        (pb.ModelSpec(), 2),  # the gateway's default model, latest version
        (pb.ModelSpec(name="detector", version=1), 1),
        (pb.ModelSpec(name="detector", version=2), 2),
        (pb.ModelSpec(name="detector", label="stable"), 1),
        (pb.ModelSpec(name="detector", label="canary"), 2),
    ],
)
def test_version_and_label_select_the_served_version(stub, spec, version):
    scene = scene_for(50)
    result = detect(stub, scenes.encode(scene.pixels, "PNG"), model=spec)
    assert (result.model.name, result.model.version) == ("detector", version)
    assert_matches(result, scene)


def test_stream_results_come_back_in_request_order(stub):
    frames = [scene_for(60 + i, 320, 240, i % 7) for i in range(12)]
    requests = (
        pb.DetectRequest(image=scenes.encode(f.pixels, "PNG"), request_id=f"frame-{i}")
        for i, f in enumerate(frames)
    )
    results = list(stub.DetectStream(requests, timeout=120))
    assert [r.request_id for r in results] == [f"frame-{i}" for i in range(12)]
    for result, frame in zip(results, frames, strict=True):
        assert_matches(result, frame)


@pytest.fixture(scope="module")
def windowed(recording: RecordingUpstream, tmp_path_factory) -> Iterator[GatewayProcess]:
    """A gateway with a stream window of STREAM_WINDOW, calling TF Serving via `recording`."""
    args = [f"--stream-window={STREAM_WINDOW}"]
    logs = tmp_path_factory.mktemp("windowed-logs")
    with run_gateway(recording.target, args, log_dir=logs) as gw:
        yield gw


def test_stream_stops_reading_frames_while_the_client_does_not_read_results(windowed, recording):
    # Read-side back-pressure: a client that sends frames as fast as gRPC takes them but
    # reads no results. The gateway answers its window of frames; gRPC sends results until
    # the client's HTTP/2 flow-control window is full; then the gateway's next result waits,
    # and it must stop taking frames. Frames accepted (one Predict upstream each) must stay
    # within what that window holds plus the gateway's window, far below what is offered.
    # The client keeps HTTP/2's default 64 KiB window: with BDP probing (gRPC's default)
    # its window grows while it does not read, and buffers hundreds of small results.
    scene = scene_for(70, 320, 240, 12, noise=0)
    frame = scenes.encode(scene.pixels, "PNG")
    probe = scenes.encode(scene_for(71, 64, 48, 1, noise=0).pixels, "PNG")
    offered = 240
    before = len(recording.predicts)

    def frames() -> int:
        """Frames of the stream that reached TF Serving (the probes are smaller)."""
        return sum(_sent_size(r) == (320, 240) for r in recording.predicts[before:])

    handed = 0  # frames the client's gRPC has taken from the generator to send

    def requests() -> Iterator[pb.DetectRequest]:
        nonlocal handed
        for i in range(offered):
            handed += 1
            yield pb.DetectRequest(image=frame, request_id=str(i))

    options = [*CHANNEL_OPTIONS, ("grpc.http2.bdp_probe", 0)]
    with grpc.insecure_channel(windowed.target, options=options) as channel:
        results = windowed.stub(channel).DetectStream(requests(), timeout=600)
        # Nothing reads `results` yet.
        accepted = _stopped_taking_frames(frames, windowed, probe, lambda: handed)
        # The client reads: the gateway takes the rest; every result arrives, in order.
        got = list(results)
    assert [r.request_id for r in got] == [str(i) for i in range(offered)]
    assert frames() == offered
    # Each result takes its size plus gRPC's 5-byte message prefix of the 65,535-byte window.
    buffered = 65_535 // (got[0].ByteSize() + 5)
    assert STREAM_WINDOW < accepted <= buffered + STREAM_WINDOW + 2 < offered, (accepted, buffered)


def _stopped_taking_frames(
    frames: Callable[[], int],
    gateway: GatewayProcess,
    probe: bytes,
    handed: Callable[[], int],
    rounds: int = 2,
) -> int:
    """`frames()` once the gateway has stopped taking frames: nothing in flight, and the count
    (above 0) the same before and after each of `rounds` rounds of unary Detects (`probe`) that
    the gateway answered on another connection meanwhile, while the client had handed gRPC
    more frames than that (`handed()`: frames offered, not a client that fell behind). Its event
    loop reads the stream's frames too: a gateway that could take another frame would have
    taken it while it served them."""
    deadline = time.monotonic() + 120
    last, stable = -1, -1
    with gateway.channel() as channel:
        stub = gateway.stub(channel)
        while stable < rounds:
            while gateway.in_flight() != 0:
                assert time.monotonic() < deadline, "the gateway kept frames in flight"
                time.sleep(0.02)
            now = frames()
            offering = handed() > now
            stable = stable + 1 if now == last and now > 0 and offering else 0
            assert time.monotonic() < deadline, f"the gateway kept taking frames: {now} accepted"
            last = now
            for _ in range(3):
                stub.Detect(pb.DetectRequest(image=probe), timeout=60)
    return last


def test_a_bad_frame_gets_its_own_error_and_the_stream_goes_on(stub):
    good = scenes.encode(scene_for(80).pixels, "PNG")
    huge = scenes.encode(scene_for(80).pixels, "PNG")[:16] + b"\x00" * 8  # header only
    requests = [pb.DetectRequest(image=good, request_id=str(i)) for i in range(3)]
    requests.append(pb.DetectRequest(image=b"not an image", request_id="bad"))
    requests.append(pb.DetectRequest(image=good, min_score=2.0, request_id="bad-option"))
    requests.append(pb.DetectRequest(image=huge, request_id="truncated"))
    requests.append(pb.DetectRequest(image=good, request_id="after"))
    results = list(stub.DetectStream(iter(requests), timeout=60))
    assert [r.request_id for r in results] == [
        "0",
        "1",
        "2",
        "bad",
        "bad-option",
        "truncated",
        "after",
    ]
    for r in (results[0], results[1], results[2], results[6]):
        assert not r.HasField("error") and r.model.name == "detector" and r.detections
    for r in results[3:6]:
        assert r.HasField("error") and not r.detections and not r.HasField("model")
        assert r.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "could not be decoded as any supported format" in results[3].error.message
    assert "min_score must be in [0, 1]" in results[4].error.message
    assert "looks like PNG but could not be decoded" in results[5].error.message


def test_a_stream_wide_failure_ends_the_stream_after_earlier_results(stub):
    good = scenes.encode(scene_for(80).pixels, "PNG")
    requests = [pb.DetectRequest(image=good, request_id=str(i)) for i in range(2)]
    requests.append(
        pb.DetectRequest(image=good, model=pb.ModelSpec(name="no_such_model"), request_id="x")
    )
    requests.append(pb.DetectRequest(image=good, request_id="after"))
    received = []
    with pytest.raises(grpc.RpcError) as info:
        for result in stub.DetectStream(iter(requests), timeout=60):
            received.append(result.request_id)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert received == ["0", "1"]
    trailers = dict(info.value.trailing_metadata() or ())
    assert trailers.get("x-request-id")


# --- the error table -------------------------------------------------------------------


def test_empty_image_is_invalid_argument(stub):
    error = rpc_error(stub, b"")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "image is empty" in error.details()


@pytest.mark.parametrize("name", MODELS)
def test_undecodable_image_is_invalid_argument(stub, name):
    error = rpc_error(stub, b"\x00\x01garbage" * 100, model=model(name))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "could not be decoded" in error.details()


@pytest.mark.parametrize("name", MODELS)
def test_truncated_jpeg_is_invalid_argument(stub, name):
    data = scenes.encode(scene_for(90).pixels, "JPEG")
    error = rpc_error(stub, data[: len(data) // 2], model=model(name))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_image_over_the_pixel_limit_is_refused_from_its_header(stub):
    big = encode(Image.new("RGB", (2500, 2000), (128, 128, 128)), "PNG")  # 5 MP, small file
    error = rpc_error(stub, big)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "2500x2000" in error.details() and "GATEWAY_MAX_PIXELS" in error.details()


def test_image_over_the_byte_limit_is_refused(stub):
    error = rpc_error(stub, b"\xff\xd8" + bytes(MAX_IMAGE_BYTES))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GATEWAY_MAX_IMAGE_BYTES" in error.details()


def test_message_over_the_server_receive_limit_is_resource_exhausted(stub):
    error = rpc_error(stub, bytes(MAX_IMAGE_BYTES + 2 * 1024 * 1024))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_largest_allowed_image_passes_in_pixel_mode(stub):
    # 2000x2000 = the pixel limit: 12 MB as a uint8 tensor, over gRPC's 4 MiB default.
    scene = scene_for(91, 2000, 2000, 12, noise=0)
    assert_matches(detect(stub, scenes.encode(scene.pixels, "PNG"), timeout=120), scene)


@pytest.mark.parametrize(
    ("spec", "code", "text"),
    [
        (pb.ModelSpec(name="nope"), grpc.StatusCode.NOT_FOUND, "Latest(nope)"),
        (
            pb.ModelSpec(name="detector", version=9),
            grpc.StatusCode.NOT_FOUND,
            "Specific(detector, 9)",
        ),
        (
            pb.ModelSpec(name="detector", label="beta"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "Unrecognized servable version label: beta",
        ),
        (pb.ModelSpec(name="detector", version=-3), grpc.StatusCode.INVALID_ARGUMENT, "positive"),
    ],
)
def test_unknown_model_version_or_label(stub, spec, code, text):
    error = rpc_error(stub, scenes.encode(scene_for(92).pixels, "PNG"), model=spec)
    assert error.code() == code
    assert text in error.details()


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"min_score": 1.5}, "min_score must be in [0, 1]"),
        ({"min_score": -0.1}, "min_score must be in [0, 1]"),
        ({"max_detections": -1}, "max_detections must be >= 0"),
    ],
)
def test_out_of_range_fields_are_invalid_argument(stub, fields, text):
    error = rpc_error(stub, scenes.encode(scene_for(93).pixels, "PNG"), **fields)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert text in error.details()


def test_model_without_a_detection_signature_is_failed_precondition(stub):
    error = rpc_error(stub, scenes.encode(scene_for(94).pixels, "PNG"), model=model("embedder"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = error.details()
    assert "features: DT_FLOAT [-1,4]" in details and "probabilities" in details


def test_client_deadline_propagates_to_tf_serving(windowed, recording):
    # TF Serving holds the Predict until released: only the caller's deadline can end the
    # call, and TF Serving must be told that deadline rather than the gateway's own 30 s.
    data = scenes.encode(scene_for(95).pixels, "PNG")
    request_id = f"deadline-{time.monotonic_ns()}"
    with windowed.channel() as channel:
        stub = windowed.stub(channel)
        stub.Detect(pb.DetectRequest(image=data), timeout=60)  # signature cached
        cancelled = recording.cancelled
        recording.hold()
        try:
            # Long enough to reach TF Serving on a loaded machine, far below the gateway's 30 s.
            call = stub.Detect.future(
                pb.DetectRequest(image=data, request_id=request_id), timeout=10
            )
            recording.wait_active(1)
            *_, remaining = (left for name, left in recording.deadlines if name == "Predict")
            error = call.exception(timeout=60)
            # The held TF Serving call sees its caller go away: the gateway cancelled it.
            deadline = time.monotonic() + 30
            while recording.cancelled == cancelled and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            recording.release()
    assert error is not None and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The caller's 10 s, not the gateway's 30 s (gRPC rounds the grpc-timeout header up).
    assert remaining is not None and 0 < remaining < 11
    assert recording.cancelled == cancelled + 1
    [line] = _log_lines(windowed, request_id)
    assert line["code"] in ("DEADLINE_EXCEEDED", "CANCELLED")


def _log_lines(gateway: GatewayProcess, request_id: str) -> list[dict]:
    """The gateway's log lines for `request_id`, once there are any. The line is written
    when the request ends, which the caller may see a moment before it is flushed."""
    deadline = time.monotonic() + 30
    while not (lines := [r for r in gateway.records() if r.get("request_id") == request_id]):
        assert time.monotonic() < deadline, f"no log line for {request_id}"
        time.sleep(0.02)
    return lines


def test_unreachable_tf_serving_is_unavailable(tmp_path):
    with (
        closed_port() as port,
        run_gateway(dead := f"127.0.0.1:{port}", log_dir=tmp_path, wait_ready=False) as gw,
        gw.channel() as channel,
    ):
        gw.wait_health(2)  # NOT_SERVING
        with pytest.raises(grpc.RpcError) as info:
            gw.stub(channel).Detect(pb.DetectRequest(image=b"x"), timeout=20)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert dead in info.value.details()


# --- observability and external clients -------------------------------------------------


def test_one_json_log_line_per_request_without_image_bytes(stub, gateway):
    data = scenes.encode(scene_for(96).pixels, "PNG")
    detect(stub, data, request_id="log-check")
    [line] = _log_lines(gateway, "log-check")
    assert line["method"] == "Detect" and line["code"] == "OK"
    assert line["model"] == "detector" and line["version"] == 2
    assert set(line["latency_ms"]) == {"decode", "upstream", "total"}
    assert base64.b64encode(data[:64]).decode() not in gateway.log_path.read_text()


def test_prometheus_metrics_count_requests_and_stage_latency(stub, gateway):
    detect(stub, scenes.encode(scene_for(97).pixels, "PNG"))
    url = f"http://127.0.0.1:{gateway.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    assert 'detection_gateway_requests_total{code="OK",method="Detect"}' in text
    for stage in ("decode", "upstream", "total"):
        assert f'detection_gateway_latency_seconds_count{{method="Detect",stage="{stage}"}}' in text
    assert "detection_gateway_in_flight_requests" in text


def test_running_gateway_never_loads_tensorflow(stub, gateway):
    detect(stub, scenes.encode(scene_for(98).pixels, "JPEG"))
    maps = Path(f"/proc/{gateway.process.pid}/maps").read_text()
    assert "tensorflow" not in maps
    assert "_message" in maps or "upb" in maps or "protobuf" in maps  # it is the right process


def test_grpcurl_with_reflection_only(gateway):
    grpcurl = tools.binary("grpcurl", tools.GRPCURL_INSTALL)
    listed = subprocess.run(
        [grpcurl, "-plaintext", gateway.target, "list"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert "detection.v1.DetectionService" in listed.stdout.split()
    scene = scene_for(99, 640, 480, 6)
    body = json.dumps(
        {"image": base64.b64encode(scenes.encode(scene.pixels, "JPEG")).decode(), "min_score": 0.5}
    )
    out = subprocess.run(
        [grpcurl, "-plaintext", "-max-msg-sz", "67108864", "-d", "@", gateway.target,
         "detection.v1.DetectionService/Detect"],
        input=body, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    # grpcurl prints proto3 JSON; the official parser reads it back into the message.
    result = json_format.Parse(out.stdout, pb.DetectionResult())
    assert_matches(result, scene)


def test_python_client_cli_prints_json_lines(gateway, tmp_path):
    scene = scene_for(100)
    path = tmp_path / "scene.png"
    path.write_bytes(scenes.encode(scene.pixels, "PNG"))
    out = subprocess.run(
        [sys.executable, "-m", "gateway.client", str(path), str(path), "--target", gateway.target],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 2
    assert lines[0]["image"] == str(path)
    assert len(lines[0]["detections"]) == len(scene.boxes)


# --- max_side: big photos are sent at the size the model needs ---------------------------

EXAMPLE_MODEL_CONFIG = Path(__file__).resolve().parents[2] / "serving" / "gateway-models.toml"


class RecordingUpstream(FaultyUpstream):
    """Forwards to the local TF Serving and keeps every Predict request's bytes."""

    def __init__(self, backend: str) -> None:
        super().__init__(backend)
        self.predicts: list[bytes] = []

    def _handler(self, path: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        handle = super()._handler(path)
        if path != PREDICT:
            return handle

        def record(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.predicts.append(request)
            return handle(request, context)

        return record


@pytest.fixture(scope="module")
def recording(tfs) -> Iterator[RecordingUpstream]:
    with RecordingUpstream(tfs.target) as upstream:
        yield upstream


@pytest.fixture(scope="module")
def scaled_stub(recording: RecordingUpstream, tmp_path_factory) -> Iterator[object]:
    """A gateway with the example model config (serving/gateway-models.toml: max_side 1024
    for the reference detectors), calling TF Serving through `recording`."""
    args = [f"--model-config={EXAMPLE_MODEL_CONFIG}"]
    logs = tmp_path_factory.mktemp("scaled-logs")
    with run_gateway(recording.target, args, log_dir=logs) as gw, gw.channel() as channel:
        yield gw.stub(channel)


def _sent_size(request: bytes) -> tuple[int, int]:
    """(width, height) of the image in a PredictRequest: the pixel tensor's shape, or the
    header of the encoded image in a string tensor."""
    (tensor,) = tfswire.PredictRequest.FromString(request).inputs.values()
    if tensor.dtype == tfswire.DT_STRING:
        (value,) = tensor.string_val
        with Image.open(io.BytesIO(value)) as image:
            return image.size
    _, height, width, _ = (d.size for d in tensor.tensor_shape.dim)
    return width, height


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(
    ("seed", "width", "height", "fmt"),
    [
        (110, 4032, 3024, "JPEG"),  # 12 MP: DCT-scaled decode (1/2), then resized to 1024x768
        (111, 2048, 1536, "JPEG"),  # exactly 1/2: the DCT-scaled decode alone
        (112, 1500, 1000, "PNG"),  # no DCT scaling: resized only, to 1024x683
        (113, 3024, 4032, "JPEG"),  # portrait
    ],
)
def test_max_side_sends_the_scaled_image_and_boxes_stay_within_1px_at_the_sent_scale(
    scaled_stub, recording, name, seed, width, height, fmt
):
    longest = max(width, height)
    scale = 1024 / longest
    # Rectangles at least ~12 px and 4 px apart once scaled down.
    rng = np.random.default_rng(seed)
    scene = scenes.generate_scene(
        rng, width, height, 8, noise_sigma=4.0, min_side=round(12 / scale),
        max_side=longest // 4, gap=round(4 / scale),
    )  # fmt: skip
    data = scenes.encode(scene.pixels, fmt, quality=92)
    before = len(recording.predicts)
    result = detect(scaled_stub, data, model=model(name), timeout=120)
    [sent] = recording.predicts[before:]
    sent_w, sent_h = _sent_size(sent)
    assert (sent_w, sent_h) == (round(width * scale), round(height * scale))
    if name == "detector_encoded":
        assert len(sent) < len(data) / 2  # a JPEG of the scaled image, not the original
    assert (result.image_width, result.image_height) == (width, height)
    # At the scale the model saw: truth scaled down, the model's (normalised) box scaled up.
    unmatched = list(result.detections)
    for truth in scene.boxes:
        want = (
            truth.x_min * sent_w / width, truth.y_min * sent_h / height,
            truth.x_max * sent_w / width, truth.y_max * sent_h / height,
        )  # fmt: skip

        def at_sent_scale(d: pb.Detection) -> tuple[float, float, float, float]:
            n = d.normalized_box
            return n.x_min * sent_w, n.y_min * sent_h, n.x_max * sent_w, n.y_max * sent_h

        match = next(
            (
                d
                for d in unmatched
                if d.class_id == truth.class_id
                and max(abs(a - b) for a, b in zip(at_sent_scale(d), want, strict=True)) <= 1.0
            ),
            None,
        )
        assert match is not None, f"{truth} (sent scale {want}) not found in {result.detections}"
        unmatched.remove(match)
    assert [d for d in unmatched if d.score >= 0.5] == []


@pytest.mark.parametrize("name", MODELS)
def test_max_side_leaves_an_image_within_it_as_it_is(scaled_stub, recording, name):
    scene = scene_for(114, 1000, 700, 6)
    data = scenes.encode(scene.pixels, "JPEG")
    before = len(recording.predicts)
    assert_matches(detect(scaled_stub, data, model=model(name)), scene)
    [sent] = recording.predicts[before:]
    assert _sent_size(sent) == (1000, 700)
    if name == "detector_encoded":
        (tensor,) = tfswire.PredictRequest.FromString(sent).inputs.values()
        assert tensor.string_val == [data]  # the caller's bytes, untouched
