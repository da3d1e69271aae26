"""detection-batch end to end: a real gateway process and the local TF Serving on loopback.

One dataset of 1,040 generated images (2 % truncated PNGs, one zero-byte file, one PNG
header claiming 100000 x 100000 pixels) is run as a directory, as a JSON Lines manifest and
as TFRecord files (with one record whose checksum is broken). Every output line is checked
against a unary Detect of the same image on the same gateway (all 1,040, no sampling).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from gateway.proto.detection.v1 import detection_pb2 as pb
from tests.support import datasets as data
from tests.support.batch import lines, ok, run
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer, closed_port

COUNT = 1040
CORRUPT_RECORD = 333


@pytest.fixture(scope="module")
def images() -> list[data.Image]:
    return data.make_images(COUNT)


@pytest.fixture(scope="module")
def expected(gateway: GatewayProcess, images: list[data.Image]) -> dict[str, Any]:
    """Unary Detect of every image: the result (request id cleared) or (code, message)."""
    answers: dict[str, Any] = {}
    with gateway.channel() as channel:
        stub = gateway.stub(channel)
        for image in images:
            try:
                result = stub.Detect(pb.DetectRequest(image=image.data), timeout=60)
            except grpc.RpcError as e:
                answers[image.key] = (e.code().name, e.details())
                continue
            result.request_id = ""
            answers[image.key] = result
    return answers


def check_line(line: dict[str, Any], image: data.Image, expected: dict[str, Any]) -> str:
    """The line holds what unary Detect gave for the image; returns its code."""
    want = expected[image.key]
    if isinstance(want, tuple):
        assert "result" not in line, (image.key, image.kind)
        assert (line["error"]["code"], line["error"]["message"]) == want, image.key
        return str(want[0])
    assert "error" not in line, (image.key, line["error"])
    result = json_format.ParseDict(line["result"], pb.DetectionResult())
    assert result.request_id  # the runner names each request after its output line
    result.request_id = ""
    assert result == want, image.key
    # proto3 JSON with every field present, also the zero ones, named as in the .proto (the
    # convention of everything the gateway writes, as its HTTP door)
    assert {"detections", "image_width", "image_height", "model", "request_id"} <= set(
        line["result"]
    )
    return "OK"


def expected_codes(images: list[data.Image], expected: dict[str, Any]) -> Counter[str]:
    return Counter(v[0] if isinstance(v, tuple) else "OK" for v in expected.values())


def test_unary_reference_has_the_planted_failures(images, expected) -> None:
    kinds = Counter(i.kind for i in images)
    assert kinds == {"good": COUNT - 23, "corrupt": 21, "empty": 1, "huge": 1}
    for image in images:
        failed = isinstance(expected[image.key], tuple)
        assert failed == (image.kind != "good"), image.key
        if failed:
            assert expected[image.key][0] == "INVALID_ARGUMENT"


def test_directory(tmp_path: Path, gateway: GatewayProcess, images, expected) -> None:
    source = data.write_directory(tmp_path / "in", images)
    started = time.monotonic()
    summary = ok(run([str(source), str(tmp_path / "out"), "--target", gateway.target]))
    seconds = time.monotonic() - started
    out = tmp_path / "out"
    got = lines(out / "results-00000-of-00001.jsonl")
    assert len(got) == COUNT
    codes: Counter[str] = Counter()
    for line, image in zip(got, images, strict=True):
        assert line["id"] == image.key
        assert line["source"] == str(source / image.key)
        assert line["metadata"] == {}
        codes[check_line(line, image, expected)] += 1
    assert codes == expected_codes(images, expected)
    assert summary["codes"] == dict(codes)
    job = json.loads((out / "summary.json").read_text())
    assert (out / "_SUCCESS").exists() and (out / "_SUCCESS.00000").exists()
    assert job["images"] == COUNT and job["codes"] == dict(codes)
    assert job["served_by"] == [{"model": "detector", "version": 1, "images": codes["OK"]}]
    assert job["errors"] == COUNT - codes["OK"]
    assert not [p for p in (out / "_batch" / "parts").rglob("*") if p.is_file()]
    print(f"directory: {COUNT} images in {seconds:.1f} s")


def test_manifest(tmp_path: Path, gateway: GatewayProcess, images, expected) -> None:
    data.write_directory(tmp_path / "in" / "pictures", images)
    manifest = data.write_manifest(tmp_path / "in" / "list.jsonl", images, "pictures")
    ok(run([str(manifest), str(tmp_path / "out"), "--target", gateway.target]))
    got = lines(tmp_path / "out" / "list.jsonl.jsonl")
    assert len(got) == COUNT
    for number, (line, image) in enumerate(zip(got, images, strict=True)):
        if number == 3:
            assert line["error"]["code"] == "INVALID_ARGUMENT" and line["id"] == 3
            assert line["error"]["message"].startswith("line 4:")
            continue
        assert line["id"] == (f"m-{number}" if number % 3 == 0 else number)
        assert line["metadata"] == {"n": number}
        check_line(line, image, expected)


def test_a_long_non_ascii_file_name_still_makes_request_ids_the_doors_take(
    tmp_path: Path, gateway: GatewayProcess, images, expected
) -> None:
    """The runner names each request `file:index`; a file name the doors' rule refuses (over
    64 characters, non-ASCII) is hashed instead, so every image is still answered."""
    few = [image for image in images if image.kind == "good"][:3]  # line 4 is a broken one
    data.write_directory(tmp_path / "in" / "pictures", few)
    name = "données-" + "x" * 80 + ".jsonl"
    manifest = data.write_manifest(tmp_path / "in" / name, few, "pictures")
    ok(run([str(manifest), str(tmp_path / "out"), "--target", gateway.target]))
    got = lines(tmp_path / "out" / (name + ".jsonl"))
    assert len(got) == len(few) and all("result" in line for line in got), got
    ids = [line["result"]["request_id"] for line in got]
    assert all(len(i) <= 64 and i.isascii() and i.endswith(f":{n}") for n, i in enumerate(ids))


def test_tfrecords(tmp_path: Path, gateway: GatewayProcess, images, expected) -> None:
    source = data.write_tfrecords(tmp_path / "in", images, files=4, corrupt=CORRUPT_RECORD)
    summary = ok(run([str(source), str(tmp_path / "out"), "--target", gateway.target]))
    per_file = COUNT // 4
    got = []
    for f in range(4):
        part = lines(tmp_path / "out" / f"part-{f:03d}.tfrecord.jsonl")
        assert len(part) == per_file
        got += part
    for position, (line, image) in enumerate(zip(got, images, strict=True)):
        index = position % per_file
        assert line["source"].endswith(f"part-{position // per_file:03d}.tfrecord#{index}")
        if position == CORRUPT_RECORD:
            assert line["id"] == index and line["error"]["code"] == "DATA_LOSS"
            assert "checksum" in line["error"]["message"]
            continue
        want_id = {0: f"s-{position}", 1: image.key, 2: index}[position % 3]
        assert line["id"] == want_id
        assert line["metadata"]["image/format"] == ["png"]
        check_line(line, image, expected)
    assert summary["codes"]["DATA_LOSS"] == 1


def test_shards_split_the_work_and_the_last_one_finalizes(
    tmp_path: Path, gateway: GatewayProcess, images
) -> None:
    subset = images[:101]
    source = data.write_directory(tmp_path / "in", subset)
    out = tmp_path / "out"
    base = [str(source), str(out), "--target", gateway.target]
    ok(run([*base, "--shard-index", "2", "--shard-count", "3"]))
    ok(run([*base], extra_env={"JOB_COMPLETION_INDEX": "0", "BATCH_SHARD_COUNT": "3"}))
    assert not (out / "_SUCCESS").exists()
    failed = run(["finalize", str(out)])
    assert failed.returncode == 2 and "1 of 3 shards have not finished" in failed.stderr
    assert "Traceback" not in failed.stderr
    ok(run([*base, "--shard-index", "1", "--shard-count", "3"]))
    assert (out / "_SUCCESS").exists()
    got = [line["id"] for s in range(3) for line in lines(out / f"results-{s:05d}-of-00003.jsonl")]
    assert got == [i.key for i in subset]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["images"] == 101 and summary["shards"] == 3
    assert ok(run(["finalize", str(out)]))["images"] == 101
    wrong = run([*base, "--shard-index", "0", "--shard-count", "2"])
    assert wrong.returncode == 2 and "shards: 3 before, 2 now" in wrong.stderr


def test_bad_inputs_and_arguments_are_clear_errors(tmp_path: Path, gateway) -> None:
    target = ["--target", gateway.target]
    missing = run([str(tmp_path / "nope"), str(tmp_path / "out"), *target])
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    (tmp_path / "empty").mkdir()
    empty = run([str(tmp_path / "empty"), str(tmp_path / "out"), *target])
    assert empty.returncode == 2 and "is empty" in empty.stderr
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.png").write_bytes(b"x")
    inside = run([str(tmp_path / "in"), str(tmp_path / "in" / "out"), *target])
    assert inside.returncode == 2 and "inside INPUT" in inside.stderr
    score = run([str(tmp_path / "in"), str(tmp_path / "out"), *target, "--min-score", "2"])
    assert score.returncode == 2 and "min_score must be in [0, 1]" in score.stderr
    generic = run([str(tmp_path / "in"), str(tmp_path / "out"), *target, "--option=min_score=2"])
    assert generic.returncode == 2 and "min_score must be in [0, 1]" in generic.stderr
    ok(run([str(tmp_path / "in"), str(tmp_path / "out"), *target]))
    other = run([str(tmp_path / "in"), str(tmp_path / "out"), *target, "--max-detections", "3"])
    assert other.returncode == 2 and "max_detections: 0 before, 3 now" in other.stderr
    (tmp_path / "in" / "b.png").write_bytes(b"y")
    changed = run([str(tmp_path / "in"), str(tmp_path / "out"), *target])
    assert changed.returncode == 2 and "the input files changed" in changed.stderr
    nothing = run(["finalize", str(tmp_path / "empty")])
    assert nothing.returncode == 2 and "holds no batch job" in nothing.stderr
    for process in (missing, empty, inside, other, changed, nothing):
        assert "Traceback" not in process.stderr


@pytest.fixture
def small_gateway(tfs: LocalServer, model_repo: Path, tmp_path: Path) -> Iterator[GatewayProcess]:
    """A gateway that takes 3 images at a time: most of 32 in flight get RESOURCE_EXHAUSTED."""
    args = ["--max-concurrent-requests=3", "--stream-window=2", "--max-pixels=4000000"]
    with run_gateway(tfs.target, args, log_dir=tmp_path) as gw:
        yield gw


def test_overloaded_gateway_is_retried_not_an_error(
    tmp_path: Path, small_gateway: GatewayProcess, images
) -> None:
    subset = [i for i in images[:150] if i.kind == "good"]
    source = data.write_directory(tmp_path / "in", subset)
    summary = ok(
        run([str(source), str(tmp_path / "out"), "--target", small_gateway.target,
             "--concurrency", "32"])
    )  # fmt: skip
    assert summary["codes"] == {"OK": len(subset)}
    assert summary["this_run"]["retries"] > 0
    refused = [r for r in small_gateway.records() if r.get("code") == "RESOURCE_EXHAUSTED"]
    assert refused, "the gateway never refused: the test did not overload it"


def test_gateway_down_fails_clearly_and_resumes(
    tmp_path: Path, gateway: GatewayProcess, images
) -> None:
    source = data.write_directory(tmp_path / "in", images[:60])
    out = tmp_path / "out"
    # A held port that refuses connections; the run gives up by itself (timeout: a hang).
    with closed_port() as port:
        dead = f"127.0.0.1:{port}"
        down = run([str(source), str(out), "--target", dead, "--give-up-after", "2"], timeout=120)
    assert down.returncode == 1, down.stderr[-2000:]
    assert f"no answer from the gateway at {dead}" in down.stderr
    assert "run the same command again to resume" in down.stderr
    assert "Traceback" not in down.stderr
    assert not (out / "results-00000-of-00001.jsonl").exists()
    summary = ok(run([str(source), str(out), "--target", gateway.target]))
    assert summary["images"] == 60
    assert [line["id"] for line in lines(out / "results-00000-of-00001.jsonl")] == [
        i.key for i in images[:60]
    ]
