"""The owner travels with a runner pod's calls (issue 42.7): `detection-batch --owner` names the
job's owner on every call (x-vision-job-owner), and the gateway counts the images under that
owner (quota, metrics, payload log) only when the call comes from an identity
GATEWAY_BATCH_RUNNER_IDENTITIES names. Any other caller naming an owner (a forgery) is
refused PERMISSION_DENIED, on the runner's streams and on a plain call alike."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.identity import JOB_OWNER
from gateway.jobs.runner.__main__ import main as batch_main
from gateway.proto.detection.v1 import detection_pb2 as pb
from tests.support import jobs as helpers
from tests.support.certs import Certificates, make_certificates
from tests.support.gatewayproc import GatewayProcess
from tests.support.localserver import LocalServer
from tests.support.waiting import wait_for

RUNNER = "spiffe://test.local/ns/jobs/sa/detection-batch"
MALLORY = "spiffe://test.local/ns/x/sa/mallory"
ALICE = "uri:spiffe://test.local/ns/shop/sa/alice"
IMAGES = 3


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    clients = {"runner": RUNNER, "mallory": MALLORY}
    return make_certificates(tmp_path_factory.mktemp("owner-certs"), clients=clients)


@pytest.fixture(scope="module")
def gateway(
    tfs: LocalServer,
    certs: Certificates,
    module_store: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[GatewayProcess, Path]]:
    root = tmp_path_factory.mktemp("owner")
    (root / "quotas.toml").write_text(f'[callers."{ALICE}"]\nrate = 1000\n')
    (root / "paylog.toml").write_text("[default]\nrate = 1.0\n")
    log = root / "payloads.jsonl"
    extra = [
        f"--batch-runner-identities=uri:{RUNNER}",
        f"--quotas={root / 'quotas.toml'}",
        f"--payload-log={log}",
        f"--payload-log-config={root / 'paylog.toml'}",
    ]
    with helpers.gateway(tfs, module_store, root, extra, certs=certs) as gw:
        yield gw, log


def _run(gw: GatewayProcess, certs: Certificates, who: str, out: Path, *extra: str) -> int:
    images = out.parent / "images"
    if not images.exists():
        images.mkdir(parents=True)
        for n in range(IMAGES):
            (images / f"{n}.jpg").write_bytes(helpers.jpeg(n))
    pair = certs.clients[who]
    return batch_main([
        str(images), str(out), f"--target={gw.target}", "--model=detector",
        f"--ca-file={certs.ca}", f"--cert-file={pair.cert}", f"--key-file={pair.key}",
        "--give-up-after=20", *extra,
    ])  # fmt: skip


def _admitted(gw: GatewayProcess, label: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{gw.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "vision_gateway_caller_requests_total"
        and s.labels == {"caller": label, "decision": "admitted"}
    )


def test_a_runner_identity_runs_the_images_as_the_owner_it_names(
    gateway: tuple[GatewayProcess, Path], certs: Certificates, tmp_path: Path
) -> None:
    gw, log = gateway
    before = _admitted(gw, ALICE)
    assert _run(gw, certs, "runner", tmp_path / "out", f"--owner={ALICE}") == 0
    lines = (tmp_path / "out" / "results-00000-of-00001.jsonl").read_text().splitlines()
    assert len(lines) == IMAGES and all("result" in json.loads(line) for line in lines)
    # Each image and the options check, at least (an image the runner sends again counts again).
    assert _admitted(gw, ALICE) - before >= IMAGES + 1
    # Logged under the owner: each image, and the options check (refused: no image).
    wait_for(
        lambda: log.exists() and len(log.read_text().splitlines()) >= IMAGES + 1,
        "the payload log's events",
    )
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert {e["caller"] for e in events} == {ALICE}
    codes = [e["code"] for e in events]
    assert codes.count("INVALID_ARGUMENT") == 1 and codes.count("OK") >= IMAGES, codes


def test_another_caller_naming_an_owner_is_refused(
    gateway: tuple[GatewayProcess, Path],
    certs: Certificates,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    gw, _ = gateway
    before = _admitted(gw, ALICE)
    # The runner command with mallory's certificate: the run stops (exit 1), nothing counted.
    assert _run(gw, certs, "mallory", tmp_path / "out", f"--owner={ALICE}") == 1
    err = capsys.readouterr().err
    assert f"{JOB_OWNER} is set by the gateway's batch runners only" in err
    assert f"URI SAN {MALLORY} is not one of them" in err
    assert _admitted(gw, ALICE) == before
    # A plain call with the header, from mallory and without any certificate's say.
    with helpers.channel(gw, certs, "mallory") as channel, pytest.raises(grpc.RpcError) as refused:
        gw.stub(channel).Detect(
            pb.DetectRequest(image=helpers.jpeg(1)), metadata=((JOB_OWNER, ALICE),), timeout=30
        )
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_runner_naming_no_typed_identity_is_refused(
    gateway: tuple[GatewayProcess, Path], certs: Certificates
) -> None:
    gw, _ = gateway
    with helpers.channel(gw, certs, "runner") as channel:
        for owner in ("alice", "uri:", "cn:" + "a" * 1025, "anonymous:x"):
            with pytest.raises(grpc.RpcError) as refused:
                gw.stub(channel).Detect(
                    pb.DetectRequest(image=helpers.jpeg(1)),
                    metadata=((JOB_OWNER, owner),),
                    timeout=30,
                )
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, owner
