"""Rollouts through the real doors (issue 35.2): the local TF Serving serving `detector` as
version 1, version 2 (the same detector) and version 3 (exported with two class colours
swapped, so boxes of classes 1 and 2 come back as each other), gateway processes with a
model config that gives `detector` a rollout, gRPC with the generated stubs, the summary over
the HTTP door and the metrics from the metrics port.

- A canary at weight 10 sticky on the request id serves 10 % +- 3 % of 2,000 requests from
  the candidate; requests that name a version or label are never rerouted.
- Sticky by caller (x-forwarded-client-cert, trusted) keeps each caller on one side.
- A shadow on version 3 shows the difference in its summary and metrics: precision and
  recall below 1 by exactly the boxes whose class the candidate swapped, score deltas 0.
- A held shadow call never delays the caller, and copies beyond the cap are dropped, counted.
Latency with and without a shadow at c16 is a benchmark (bench/), not a test.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from gateway import modelcheck
from gateway.app import built_in_tasks
from gateway.config import Settings
from gateway.models import load_registry
from gateway.policy.shadow import MAX_PENDING
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.proto.vision.v1 import model_pb2
from serving import scenes
from serving.export import export_models
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer, run_local_server

pytestmark = pytest.mark.slow  # gateway processes and the local TF Serving
SWAPPED = {1: 2, 2: 1}  # class ids version 3 gives each other's label
XFCC = "x-forwarded-client-cert"
OPERATOR = "spiffe://test.local/ns/ops/sa/operator"


def export_swapped(root: Path) -> None:
    """Version 3 of `detector`: the reference detector with its first two class colours
    swapped (its "weights"), so a red box is reported as green and the other way round."""
    import tensorflow as tf

    from serving import detector

    module = detector.ImageTensorDetector(3)
    palette = module.palette.numpy()
    palette[[0, 1]] = palette[[1, 0]]
    module.palette.assign(palette)
    signature = module.__call__.get_concrete_function()
    tf.saved_model.save(
        module, str(root / "detector" / "3"), signatures={"serving_default": signature}
    )


@pytest.fixture(scope="module")
def repo(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rollout-models")
    shutil.copytree(model_repo / "detector", root / "detector")
    export_models(root, version=2, names=["detector"])
    export_swapped(root)
    (root / "models.config").write_text(
        f"""
        model_config_list {{
          config {{
            name: 'detector' base_path: '{root / "detector"}' model_platform: 'tensorflow'
            model_version_policy {{ all {{}} }}
            version_labels {{ key: 'stable' value: 1 }}
            version_labels {{ key: 'canary' value: 2 }}
          }}
        }}
        """
    )
    return root


@pytest.fixture(scope="module")
def tfs(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    args = [
        f"--model_config_file={repo / 'models.config'}",
        "--allow_version_labels_for_unavailable_models",
    ]
    with run_local_server(args, log_dir=tmp_path_factory.mktemp("rollout-serving")) as server:
        yield server


def gateway_with(
    upstream: str, repo: Path, rollout: str, log_dir: Path, *args: str
) -> Iterator[GatewayProcess]:
    config = log_dir / "models.toml"
    config.write_text(
        f"""
        [models.detector]
        task = "detection"
        label_map = "{repo / "detector" / "1" / "assets.extra" / "label_map.pbtxt"}"
        [models.detector.rollout]
        {rollout}
        """
    )
    flags = [f"--model-config={config}", *args]
    with run_gateway(upstream, flags, log_dir=log_dir, http=True) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def canary_gateway(tfs: LocalServer, repo: Path, tmp_path_factory) -> Iterator[GatewayProcess]:
    rollout = """
        current = { version = 1 }
        canary = { version = 2, weight = 10 }
        sticky = "request_id"
    """
    yield from gateway_with(tfs.target, repo, rollout, tmp_path_factory.mktemp("canary"))


@pytest.fixture(scope="module")
def upstream(tfs: LocalServer) -> Iterator[FaultyUpstream]:
    with FaultyUpstream(tfs.target) as faulty:
        yield faulty


@pytest.fixture(scope="module")
def shadow_gateway(
    upstream: FaultyUpstream, repo: Path, tmp_path_factory
) -> Iterator[GatewayProcess]:
    rollout = """
        current = { label = "stable" }
        canary = { label = "canary", weight = 50 }
        sticky = "caller"
        shadow = { version = 3, share = 1.0 }
    """
    log_dir = tmp_path_factory.mktemp("shadow")
    yield from gateway_with(
        upstream.target, repo, rollout, log_dir, "--trust-xfcc=true",
        f"--operator-identities=uri:{OPERATOR}",
    )  # fmt: skip


def image(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    scene = scenes.generate_scene(rng, 160, 120, 5, noise_sigma=2.0)
    return scenes.encode(scene.pixels, "PNG")


def detect(
    stub: pb_grpc.DetectionServiceStub, data: bytes, caller: str = "", **model: object
) -> pb.DetectionResult:
    """One Detect for `detector` (with `model` fields: version or label), as `caller` (an
    x-forwarded-client-cert the gateway trusts) when given."""
    spec = model_pb2.ModelSpec(name="detector", **model)  # type: ignore[arg-type]
    metadata = ((XFCC, f'By=spiffe://gw;URI="{caller}"'),) if caller else ()
    result: pb.DetectionResult = stub.Detect(
        pb.DetectRequest(image=data, model=spec), timeout=60, metadata=metadata
    )
    return result


def summary(gateway: GatewayProcess, caller: str = OPERATOR) -> dict:
    """The rollout summary, read as `caller` (the shadow gateway's operator by default; the
    canary gateway knows no caller and lets anyone read it)."""
    url = f"{gateway.http_url}/v1/models/detector/rollout"
    headers = {XFCC: f'By=spiffe://gw;URI="{caller}"'} if caller else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def test_rollout_statistics_are_for_operators_only(shadow_gateway):
    """Where the gateway knows its callers, only GATEWAY_OPERATOR_IDENTITIES read them."""
    for caller in ("", "spiffe://test.local/ns/shop/sa/app"):
        with pytest.raises(urllib.error.HTTPError) as info:
            summary(shadow_gateway, caller)
        assert info.value.code == 403
        body = info.value.read().decode()
        assert "GATEWAY_OPERATOR_IDENTITIES" in body
        assert "precision" not in body and "served" not in body
    assert "shadow" in summary(shadow_gateway)


def metric(gateway: GatewayProcess, name: str, **labels: str) -> float:
    url = f"http://127.0.0.1:{gateway.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} with {labels} in the metrics")


def settled(gateway: GatewayProcess) -> dict:
    """The shadow summary once every copy sent has been answered and compared (polled: the
    copies run in the gateway after the callers' answers)."""
    deadline = time.monotonic() + 60
    while True:
        shadow = summary(gateway)["shadow"]
        calls = shadow["calls"]
        if calls["sent"] == shadow["detection"]["images"] + calls["failed"]:
            return shadow
        assert time.monotonic() < deadline, shadow
        time.sleep(0.02)


def test_a_canary_at_weight_10_serves_10_percent_of_2000_requests(canary_gateway):
    rng = random.Random(352)
    ids = [f"{rng.getrandbits(128):032x}" for _ in range(2000)]
    data = image(1)
    with canary_gateway.channel() as channel:
        stub = canary_gateway.stub(channel)

        def version(request_id: str) -> int:
            spec = model_pb2.ModelSpec(name="detector")
            request = pb.DetectRequest(image=data, model=spec, request_id=request_id)
            return int(stub.Detect(request, timeout=60).model.version)

        with ThreadPoolExecutor(8) as pool:
            versions = list(pool.map(version, ids))
        again = [version(i) for i in ids[:100]]  # the same ids land on the same side
    assert set(versions) == {1, 2}
    canary = versions.count(2)
    assert 140 <= canary <= 260, canary  # 10 % +- 3 % of 2,000
    assert again == versions[:100]
    served = summary(canary_gateway)["canary"]
    assert (served["candidate"], served["weight"]) == ("version 2", 10.0)
    routed = canary + again.count(2)
    assert served["served"] == {"canary": routed, "current": 2100 - routed}
    labels = {"model": "detector", "candidate": "version:2"}
    assert metric(canary_gateway, "vision_gateway_rollout_requests_total", side="canary",
                  **labels) == routed  # fmt: skip


def test_requests_naming_a_version_or_label_are_never_rerouted(canary_gateway):
    data = image(2)
    with canary_gateway.channel() as channel:
        stub = canary_gateway.stub(channel)
        before = summary(canary_gateway)["canary"]["served"]
        for _ in range(30):
            assert detect(stub, data, version=1).model.version == 1
            assert detect(stub, data, label="canary").model.version == 2
            assert detect(stub, data, label="stable").model.version == 1
        assert summary(canary_gateway)["canary"]["served"] == before


def test_a_model_without_a_rollout_has_no_summary(canary_gateway):
    url = f"{canary_gateway.http_url}/v1/models/other/rollout"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=10)
    assert info.value.code == 404
    body = json.loads(info.value.read())
    assert "[models.other.rollout]" in json.dumps(body)


def test_sticky_by_caller_keeps_each_caller_on_one_side(shadow_gateway):
    data = image(3)
    sides: dict[str, set[int]] = {}
    with shadow_gateway.channel() as channel:
        stub = shadow_gateway.stub(channel)
        for n in range(12):
            caller = f"spiffe://test.local/ns/team{n}/sa/app"
            sides[caller] = {detect(stub, data, caller).model.version for _ in range(6)}
    assert all(len(seen) == 1 for seen in sides.values()), sides
    assert {next(iter(seen)) for seen in sides.values()} == {1, 2}


def current_caller(stub: pb_grpc.DetectionServiceStub, data: bytes) -> str:
    """A caller the sticky canary keeps on the current side (version 1)."""
    for n in range(100):
        caller = f"spiffe://test.local/ns/shadowed/sa/app{n}"
        if detect(stub, data, caller).model.version == 1:
            return caller
    raise AssertionError("no caller on the current side")


def test_a_shadow_that_differs_shows_the_difference(shadow_gateway):
    with shadow_gateway.channel() as channel:
        stub = shadow_gateway.stub(channel)
        caller = current_caller(stub, image(4))
        before = settled(shadow_gateway)
        expected = []
        for seed in range(10, 22):
            answer = detect(stub, image(seed), caller)
            assert answer.model.version == 1
            boxes = [d.class_id for d in answer.detections]
            kept = sum(1 for c in boxes if c not in SWAPPED)
            expected.append(kept / len(boxes) if boxes else 1.0)
    after = settled(shadow_gateway)
    images = after["detection"]["images"] - before["detection"]["images"]
    assert images == 12
    assert after["candidate"] == "version 3" and after["share"] == 1.0

    def added(key: str) -> float:
        old, new = before["detection"], after["detection"]
        return new[key] * new["images"] - (old[key] or 0.0) * old["images"]

    # Same boxes, two classes' labels swapped: each image's precision and recall are the
    # share of its boxes of the other classes.
    assert added("precision") == pytest.approx(sum(expected), abs=1e-3)
    assert added("recall") == pytest.approx(sum(expected), abs=1e-3)
    assert sum(expected) < 12
    assert after["detection"]["matched_pairs"] > before["detection"]["matched_pairs"]
    assert after["detection"]["mean_score_delta"] == pytest.approx(0.0, abs=1e-4)
    labels = {"model": "detector", "candidate": "version:3"}
    count = metric(shadow_gateway, "vision_gateway_shadow_detection_precision_count", **labels)
    assert count == after["detection"]["images"]
    total = metric(shadow_gateway, "vision_gateway_shadow_detection_recall_sum", **labels)
    assert total == pytest.approx(after["detection"]["recall"] * count, abs=1e-3)


def test_a_held_shadow_never_delays_the_caller_and_extra_copies_are_dropped(
    shadow_gateway, upstream
):
    data = image(5)
    with shadow_gateway.channel() as channel:
        stub = shadow_gateway.stub(channel)
        caller = current_caller(stub, data)
        before = settled(shadow_gateway)
        upstream.hold(only=lambda request: request.model_spec.version.value == 3)
        try:
            for held in range(3):
                # The answer arrives while the copies of the earlier requests are held.
                assert detect(stub, data, caller).model.version == 1
                upstream.wait_active(held + 1)
            for _ in range(MAX_PENDING):
                assert detect(stub, data, caller).model.version == 1
            assert upstream.active == MAX_PENDING  # the cap: the rest were dropped
            calls = summary(shadow_gateway)["shadow"]["calls"]
            assert calls["dropped"] - before["calls"]["dropped"] == 3
            labels = {"model": "detector", "candidate": "version:3", "outcome": "dropped"}
            assert (
                metric(shadow_gateway, "vision_gateway_shadow_calls_total", **labels)
                == (calls["dropped"])
            )
        finally:
            upstream.release()
    after = settled(shadow_gateway)
    assert after["calls"]["sent"] - before["calls"]["sent"] == MAX_PENDING
    assert after["detection"]["images"] - before["detection"]["images"] == MAX_PENDING


def test_check_models_shows_the_rollout_and_refuses_a_candidate_tf_serving_lacks(
    tfs: LocalServer, repo: Path, tmp_path: Path
) -> None:
    def check(rollout: str) -> modelcheck.ModelReport:
        path = tmp_path / "models.toml"
        path.write_text(
            f'[models.detector]\ntask = "detection"\n[models.detector.rollout]\n{rollout}'
        )
        tasks = built_in_tasks()
        registry = load_registry(path, "detector", tasks=tasks.config_readers)
        settings = Settings(upstream=tfs.target)
        (report,), _ = asyncio.run(modelcheck.check(settings, registry, tasks))
        return report

    report = check(
        'current = { label = "stable" }\ncanary = { label = "canary", weight = 5 }\n'
        "shadow = { version = 3, share = 0.25 }\n"
    )
    assert report.ok, report.error
    assert report.rollout == {
        "model": "detector",
        "current": "label stable",
        "current_version": 1,
        "canary": {"candidate": "label canary", "weight": 5.0, "sticky": "random", "version": 2},
        "shadow": {"candidate": "version 3", "share": 0.25, "version": 3},
    }
    assert (
        "  rollout: current = label stable (version 1); canary = label canary (version 2), "
        "weight 5 %, sticky random; shadow = version 3 (version 3), share 0.25"
    ) in modelcheck.render(report)
    missing = check("canary = { version = 7, weight = 5 }\n")
    assert not missing.ok
    assert missing.error is not None
    assert missing.error.startswith("rollout canary (version 7) cannot be served: ")
