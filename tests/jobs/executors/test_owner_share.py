"""A local job's images run as its owner (issue 42.7): admitted under the owner's quota and
fair share, waiting for its share when the owner is at its rate (never an image refused for
it), counted in the owner's metrics and logged in the payload log under the owner. Before,
they ran as the gateway's own `internal` work: no quota, no payload-log events."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gateway.proto.vision.v1 import model_pb2
from tests.support import jobs as helpers
from tests.support.jobs import Client, State, metadata
from tests.support.localserver import LocalServer
from tests.support.waiting import wait_for

IMAGES = 6
RATE = 4.0  # the owner's images per second: the job's 6 images need 5 refills of one token


def _admissions(metrics_port: int) -> dict[tuple[str, str], float]:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.labels["caller"], sample.labels["decision"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vision_gateway_caller_requests_total"
    }


def test_a_local_jobs_images_run_under_its_owners_quota_and_are_logged_under_it(
    tfs: LocalServer, store: Path, tmp_path: Path
) -> None:
    # Every caller of this gateway is `anonymous` (no certificates: one shared tenant).
    (tmp_path / "quotas.toml").write_text(f'[callers."anonymous"]\nrate = {RATE}\nburst = 1\n')
    (tmp_path / "paylog.toml").write_text("[default]\nrate = 1.0\n")
    log = tmp_path / "payloads.jsonl"
    images = tmp_path / "images"
    helpers.make_images(images, IMAGES)
    extra = [
        f"--quotas={tmp_path / 'quotas.toml'}",
        f"--payload-log={log}",
        f"--payload-log-config={tmp_path / 'paylog.toml'}",
        "--batch-concurrency=4",
    ]
    with helpers.gateway(tfs, store, tmp_path, extra) as gw, gw.channel() as channel:
        client = Client(channel)
        op = client.wait(
            client.create(input_uri=str(images), model=model_pb2.ModelSpec(name="detector")).name
        )
        assert metadata(op).state == State.SUCCEEDED, op
        lines = client.lines(op.name)
        # Throttled, not refused: every image answered, none RESOURCE_EXHAUSTED.
        assert len(lines) == IMAGES
        assert all(line.HasField("result") for line in lines), [line.error for line in lines]
        counts = _admissions(gw.metrics_port)
        assert counts.get(("anonymous", "admitted")) == IMAGES, counts
        assert counts.get(("anonymous", "rate"), 0) > 0, counts  # it waited for its share
        assert counts.get(("internal", "admitted"), 0) == 0, counts
        # Logged under the owner, one event per image.
        wait_for(
            lambda: log.exists() and len(log.read_text().splitlines()) >= IMAGES,
            "a payload-log event per image",
        )
        events = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(events) == IMAGES
    assert {e["caller"] for e in events} == {"anonymous"}
    assert {e["data"]["request"]["caller"] for e in events} == {"anonymous"}
    assert {e["code"] for e in events} == {"OK"}
