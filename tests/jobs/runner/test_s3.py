"""Input and output on an S3-compatible server on loopback (moto in server mode, as s3fs's
own tests use), through s3fs: a directory prefix, a manifest, and a SIGKILL + resume."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.runner.conftest import gateway_args
from tests.support import datasets as data
from tests.support import tools
from tests.support.batch import ok, run, start
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer, free_port

s3fs = tools.module("s3fs", "the dev extra (make venv)")
moto_server = tools.module("moto.server", "the dev extra (make venv)")

COUNT = 200
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "foo", "AWS_SECRET_ACCESS_KEY": "foo",
               "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip


@pytest.fixture(scope="module")
def s3(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[tuple[Any, dict[str, str]]]:
    """A moto S3 server on 127.0.0.1; yields an S3FileSystem and the runner's environment."""
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in CREDENTIALS.items():
        monkeypatch_module.setenv(key, value)
    monkeypatch_module.delenv("AWS_PROFILE", raising=False)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(anon=False, endpoint_url=endpoint)
    try:
        yield fs, {**CREDENTIALS, "FSSPEC_S3_ENDPOINT_URL": endpoint}
    finally:
        server.stop()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def images() -> list[data.Image]:
    return data.make_images(COUNT, seed=2)


@pytest.fixture(scope="module")
def bucket(s3: tuple[Any, dict[str, str]], images: list[data.Image]) -> str:
    fs, _ = s3
    fs.mkdir("in-bucket")
    fs.mkdir("out-bucket")
    for image in images:
        fs.pipe_file(f"in-bucket/images/{image.key}", image.data)
    return "in-bucket"


@pytest.fixture(scope="module")
def local_reference(
    images: list[data.Image], gateway: GatewayProcess, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("s3-reference")
    source = data.write_directory(root / "in", images)
    ok(run([str(source), str(root / "out"), "--target", gateway.target]))
    return [json.loads(x) for x in (root / "out" / "results-00000-of-00001.jsonl").open()]


def read_lines(fs: Any, path: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in fs.cat_file(path).decode().splitlines()]


def same_answers(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """Same ids, results and errors as the local run (sources differ: s3:// vs paths)."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a["id"] == b["id"]
        assert a.get("result") == b.get("result") and a.get("error") == b.get("error"), a["id"]


def test_directory_prefix_in_and_out_of_s3(s3, bucket, gateway, local_reference) -> None:
    fs, env = s3
    summary = ok(
        run(["s3://in-bucket/images", "s3://out-bucket/dir", "--target", gateway.target],
            extra_env=env)
    )  # fmt: skip
    assert summary["images"] == COUNT
    fs.invalidate_cache()
    got = read_lines(fs, "out-bucket/dir/results-00000-of-00001.jsonl")
    assert got[0]["source"] == "s3://in-bucket/images/img-00000.png"
    same_answers(got, local_reference)
    assert fs.exists("out-bucket/dir/_SUCCESS") and fs.exists("out-bucket/dir/summary.json")
    assert not fs.find("out-bucket/dir/_batch/parts")


def test_manifest_on_s3_with_relative_image_paths(s3, bucket, gateway, images) -> None:
    fs, env = s3
    entries = [json.dumps({"image": f"../images/{i.key}", "k": n}) for n, i in enumerate(images)]
    fs.pipe_file("in-bucket/manifests/all.jsonl", ("\n".join(entries) + "\n").encode())
    ok(
        run(["s3://in-bucket/manifests/all.jsonl", "s3://out-bucket/man", "--target",
             gateway.target], extra_env=env)
    )  # fmt: skip
    fs.invalidate_cache()
    got = read_lines(fs, "out-bucket/man/all.jsonl.jsonl")
    assert [line["id"] for line in got] == list(range(COUNT))
    assert [line["metadata"] for line in got] == [{"k": n} for n in range(COUNT)]
    assert got[5]["source"] == f"s3://in-bucket/images/{images[5].key}"


def committed(fs: Any, out: str) -> int:
    """Lines the runner has checkpointed in the bucket (parts are named START-END.jsonl)."""
    fs.invalidate_cache()
    total = 0
    for part in fs.find(f"{out}/_batch/parts"):
        start_, _, end = Path(part).stem.partition("-")
        if start_.isdigit() and end.isdigit():
            total += int(end) - int(start_)
    return total


def test_sigkill_and_resume_on_s3(
    s3, bucket, tfs: LocalServer, model_repo: Path, local_reference, tmp_path: Path
) -> None:
    """Each run is killed while it waits for TF Serving, after it checkpointed some images
    to the bucket: mid-run for certain; the last run resumes and ends with every answer."""
    fs, env = s3
    out = f"out-bucket/killed-{tmp_path.name}"
    with (
        FaultyUpstream(tfs.target) as upstream,
        run_gateway(upstream.target, gateway_args(model_repo), log_dir=tmp_path) as gw,
    ):
        args = ["s3://in-bucket/images", f"s3://{out}", "--target", gw.target,
                "--checkpoint-seconds", "0.2"]  # fmt: skip
        for passes in (COUNT // 4, COUNT // 4):
            before = committed(fs, out)
            upstream.hold(after=passes)  # the next `passes` images pass, then TF Serving waits
            process = start(args, tmp_path / "runs.log", extra_env=env)
            deadline = time.monotonic() + 120
            while committed(fs, out) <= before:
                assert process.poll() is None, "the run ended while TF Serving held its calls"
                assert time.monotonic() < deadline, "the run checkpointed nothing"
                time.sleep(0.05)
            process.send_signal(signal.SIGKILL)
            assert process.wait() == -signal.SIGKILL
            fs.invalidate_cache()
            assert not fs.exists(f"{out}/_SUCCESS")
            upstream.release()
        kept = committed(fs, out)
        summary = ok(run(args, extra_env=env))
    assert summary["images"] == COUNT
    assert 0 < kept < COUNT and summary["this_run"]["resumed_after"] > 0, (kept, summary)
    fs.invalidate_cache()
    same_answers(read_lines(fs, f"{out}/results-00000-of-00001.jsonl"), local_reference)
    assert not fs.find(f"{out}/_batch/parts")
