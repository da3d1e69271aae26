"""`python -m gateway.paylog replay` on logs written by the payload log: groups per task,
model version and options, the answers expected line for line, and every record that cannot
be replayed listed with its reason (the run through the real doors and detection-batch is
test_replay_doors.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import fsspec
import pytest

from gateway.jobs.runner.__main__ import run_parser
from gateway.paylog import sinks
from gateway.paylog.__main__ import main
from gateway.paylog.replay import Group
from gateway.paylog.sampling import FULL, HASH, Policy, Sampling
from gateway.paylog.writer import PayloadLog
from gateway.tasks.builtin import BUILT_IN
from tests.support.payloads import offer, refused

FULL_CALLER, HASH_CALLER = "cn:full", "cn:hash"


def write_log(path: Path) -> None:
    policy = Policy(Sampling(1.0, FULL), exact={HASH_CALLER: Sampling(1.0, HASH)})
    log = PayloadLog(sinks.FileSink(str(path), 1 << 30), BUILT_IN, 8 << 20, policy)
    log.start()
    offer(log, FULL_CALLER, image=b"one", request_id="a")
    offer(log, FULL_CALLER, image=b"two", request_id="b", failure=refused())
    offer(log, HASH_CALLER, image=b"three", request_id="c")
    log.close()


def test_a_log_becomes_manifests_and_expected_answers_with_the_rest_explained(
    tmp_path: Path,
) -> None:
    path = tmp_path / "payloads.jsonl"
    write_log(path)
    with path.open("a") as extra:
        extra.write("not json\n")
        extra.write(json.dumps({"specversion": "1.0", "type": "other", "id": "x"}) + "\n")
        damaged = json.loads(path.read_text().splitlines()[0])
        damaged["data"]["request"]["image"]["data"] = "dHdv"  # "two": not the logged hash
        extra.write(json.dumps(damaged) + "\n")
    out = "memory://replay-test"
    assert main(["replay", str(path), out]) == 1
    fs = fsspec.filesystem("memory")
    summary = json.loads(fs.cat_file("/replay-test/replay.json"))
    groups = {(g["version"], g["records"]): g for g in summary["groups"]}
    assert set(groups) == {(2, 2)}  # a and b: the version asked is kept for the refused one
    group = groups[(2, 2)]
    assert group["options"] == {"max_detections": 10, "min_score": 0.5}
    command = group["command"].split()
    assert command[0] == "detection-batch"
    assert command[1].endswith("/replay-test/inputs/000-detect-detector-2/requests.jsonl")
    assert command[2].endswith("/replay-test/results/000-detect-detector-2")
    assert "--version 2" in group["command"] and "--min-score 0.5" in group["command"]
    base = "/replay-test/" + group["directory"]
    requests = [json.loads(x) for x in fs.cat_file(f"{base}/requests.jsonl").splitlines()]
    assert [(r["id"], r["image_bytes"]) for r in requests] == [("a", "b25l"), ("b", "dHdv")]
    expected = [json.loads(x) for x in fs.cat_file(f"{base}/expected.jsonl").splitlines()]
    assert [e["code"] for e in expected] == ["OK", "INVALID_ARGUMENT"]
    assert expected[0]["result"]["detections"][0]["label"] == "car"
    assert expected[1]["error"]["message"].startswith("the image is empty")
    reasons = [(s["line"].rsplit(":", 1)[1], s["reason"]) for s in summary["skipped"]]
    assert [number for number, _ in reasons] == ["3", "4", "5", "6"]
    assert "only the image's sha256" in reasons[0][1] and "--images DIR" in reasons[0][1]
    assert reasons[1][1].startswith("not JSON")
    assert reasons[2][1].startswith("not a payload log event")
    assert "does not match its sha256" in reasons[3][1]
    assert summary["skipped"][0]["request_id"] == "c"
    fs.rm("/replay-test", recursive=True)


def test_a_log_that_is_not_there_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(tmp_path / "missing.jsonl"), str(tmp_path / "out")]) == 2
    assert f"no payload log at {tmp_path / 'missing.jsonl'}" in capsys.readouterr().err


def test_a_log_in_object_storage_replays_from_its_prefix() -> None:
    fs = fsspec.filesystem("memory")
    sink = sinks.open_sink("memory://paylog-objects/2026", 1 << 20, 5)
    log = PayloadLog(sink, BUILT_IN, 8 << 20, Policy(Sampling(1.0, FULL)))
    log.start()
    for i in range(5):
        offer(log, FULL_CALLER, image=b"x" * 300_000 + bytes([i]), request_id=f"r{i}")
    log.close()
    assert len(fs.find("/paylog-objects/2026")) >= 2  # a chunk per 1 MiB: several objects
    assert main(["replay", "memory://paylog-objects/2026", "memory://paylog-replayed"]) == 0
    summary = json.loads(fs.cat_file("/paylog-replayed/replay.json"))
    (group,) = summary["groups"]
    manifest = fs.cat_file(f"/paylog-replayed/{group['directory']}/requests.jsonl")
    assert [json.loads(x)["id"] for x in manifest.splitlines()] == [f"r{i}" for i in range(5)]
    fs.rm("/paylog-objects", recursive=True)
    fs.rm("/paylog-replayed", recursive=True)


def test_a_groups_command_gives_each_option_as_detection_batch_reads_it() -> None:
    """A string option is its value, not its repr (`--mask-format polygon`, never
    `"'polygon'"`), and the command parses back to the logged options."""
    group = Group(
        "inputs/000-segment-masks", "segment", "masks", None, None,
        {"mask_format": "polygon", "mask_threshold": 0.3, "max_detections": 5},
    )  # fmt: skip
    command = shlex.split(shlex.join(group.command("out")))
    assert command[command.index("--mask-format") + 1] == "polygon"
    args = run_parser().parse_args(command[1:])
    assert (args.task, args.mask_format, args.mask_threshold, args.max_detections) == (
        "segment", "polygon", 0.3, 5,
    )  # fmt: skip
