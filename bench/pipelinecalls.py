"""The client side of `python -m bench.pipelines`: the picture, and one image's work each way
(the pipeline in one call, or the caller's own Detect, crops and Classify calls), from a Python
gRPC client with sync stubs, in a closed loop of threads.

The picture is a generated 640x480 scene (serving.scenes, seed SEED) as a JPEG, on which the
reference detector finds exactly BOXES boxes at MIN_SCORE (bench.pipelines checks it before
measuring).
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from collections.abc import Callable

import grpc
import numpy as np
from PIL import Image

from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.proto.pipeline.v1 import pipeline_pb2 as ppb
from gateway.proto.pipeline.v1 import pipeline_pb2_grpc as ppb_grpc
from gateway.proto.vision.v1 import model_pb2
from serving import scenes

PIPELINE = "detect_then_classify"
DETECTOR, CLASSIFIER, STEP = "detector", "classifier_scores", "colour"
MIN_SCORE = 0.5  # the pipeline's (serving/gateway-models.toml); the caller asks the same
SEED, RECTS, WIDTH, HEIGHT, NOISE = 39, 8, 640, 480, 4.0
BOXES = 8
JPEG_QUALITY = 90
WAYS = ("pipeline", "caller, in turn", "caller, at once")
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


def scene_image() -> bytes:
    """The benchmark's picture: 8 palette rectangles on a noisy background, as a JPEG."""
    rng = np.random.default_rng(SEED)
    scene = scenes.generate_scene(rng, WIDTH, HEIGHT, RECTS, noise_sigma=NOISE)
    return scenes.encode(scene.pixels, "JPEG", quality=JPEG_QUALITY)


class Caller:
    """One image's work, each way, over one channel (its stubs are thread-safe)."""

    def __init__(self, channel: grpc.Channel, image: bytes) -> None:
        self.image = image
        self.run = ppb_grpc.PipelineServiceStub(channel).Run
        self.detect = pb_grpc.DetectionServiceStub(channel).Detect
        self.classify = cpb_grpc.ClassificationServiceStub(channel).Classify
        self.pipeline_request = ppb.RunRequest(image=image, pipeline=PIPELINE)
        self.detect_request = pb.DetectRequest(
            image=image, model=model_pb2.ModelSpec(name=DETECTOR), min_score=MIN_SCORE
        )

    def pipeline(self) -> None:
        result = self.run(self.pipeline_request, timeout=60)
        report = result.steps[0]
        if len(result.instances) != BOXES or report.crops != BOXES or report.failed:
            raise RuntimeError(f"the pipeline answered {len(result.instances)} instances, "
                               f"{report.crops} crops, {report.failed} failed")  # fmt: skip
        for instance in result.instances:
            if not instance.steps[STEP].classes.classes:
                raise RuntimeError(f"instance {instance.id} has no classes")

    def crops(self) -> list[bytes]:
        """Detect, then each box's crop cut from the decoded image and encoded as a JPEG."""
        found = self.detect(self.detect_request, timeout=60).detections
        if len(found) != BOXES:
            raise RuntimeError(f"Detect found {len(found)} boxes, not {BOXES}")
        with Image.open(io.BytesIO(self.image)) as opened:
            picture = opened.convert("RGB")
        crops = []
        for detection in found:
            box = detection.box
            out = io.BytesIO()
            crop = picture.crop((box.x_min, box.y_min, box.x_max, box.y_max))
            crop.save(out, format="JPEG", quality=JPEG_QUALITY)
            crops.append(out.getvalue())
        return crops

    def _classify_request(self, crop: bytes) -> cpb.ClassifyRequest:
        request = cpb.ClassifyRequest(image=crop)
        request.model.name = CLASSIFIER
        return request

    def in_turn(self) -> None:
        for crop in self.crops():
            if not self.classify(self._classify_request(crop), timeout=60).classes:
                raise RuntimeError("a crop has no classes")

    def at_once(self) -> None:
        calls = [
            self.classify.future(self._classify_request(crop), timeout=60) for crop in self.crops()
        ]
        for call in calls:
            if not call.result().classes:
                raise RuntimeError("a crop has no classes")

    def way(self, name: str) -> Callable[[], None]:
        return {WAYS[0]: self.pipeline, WAYS[1]: self.in_turn, WAYS[2]: self.at_once}[name]


def closed_loop(work: Callable[[], None], concurrency: int, seconds: float) -> tuple[
    list[float], int, float
]:  # fmt: skip
    """`concurrency` threads doing `work` back to back until `seconds` have passed, each
    finishing the image it is on: (ms per image, errors, seconds from start to last end)."""
    stop = time.monotonic() + seconds
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def caller() -> None:
        while time.monotonic() < stop:
            started = time.perf_counter()
            try:
                work()
            except (grpc.RpcError, RuntimeError) as exc:
                with lock:
                    errors[0] += 1
                    if errors[0] == 1:
                        print(f"error: {exc}", file=sys.stderr, flush=True)
                continue
            took = (time.perf_counter() - started) * 1e3
            with lock:
                latencies.append(took)

    began = time.perf_counter()
    threads = [threading.Thread(target=caller) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, errors[0], time.perf_counter() - began


def own_cpu() -> float:
    """This process's CPU seconds so far (every thread: the callers and gRPC's)."""
    times = os.times()
    return times.user + times.system
