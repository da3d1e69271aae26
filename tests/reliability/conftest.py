"""Fixtures for the reliability and security tests.

`make test` runs the fast variants. `make soak` sets RELIABILITY_SOAK=1 for the long ones
(more requests, outage cycles, fuzz examples) and RELIABILITY_REPORT=<file> to write the
figures each test records (requests sent, failures by code, recovery time, memory).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.proto.detection.v1 import detection_pb2 as pb
from serving import scenes
from tests.support.localserver import LocalServer

SOAK = os.environ.get("RELIABILITY_SOAK") == "1"


def scaled(fast: int, soak: int) -> int:
    """A count for `make test`, or the larger one for `make soak`."""
    return soak if SOAK else fast


class Figures:
    """Numbers the tests measure, written as JSON for the soak table in docs/operations.md."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}

    def record(self, name: str, **values: Any) -> None:
        self.entries.setdefault(name, {}).update(values)


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", *args], capture_output=True, text=True, check=False, cwd=Path(__file__).parent
    )
    return done.stdout.strip()


def run_context() -> dict[str, Any]:
    """When, where and from what the figures come: date, machine, command, commit."""
    meminfo = Path("/proc/meminfo").read_text().split("\n")[0].split()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "nproc": os.cpu_count(),
            "memory_mib": int(meminfo[1]) // 1024 if meminfo[0] == "MemTotal:" else None,
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
        "command": " ".join(["python", "-m", "pytest", *sys.argv[1:]]),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


@pytest.fixture(scope="session")
def figures() -> Iterator[Figures]:
    collected = Figures()
    started = run_context()
    yield collected
    report = os.environ.get("RELIABILITY_REPORT")
    if report and collected.entries:
        started["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        document = {"soak": SOAK, "run": started, **collected.entries}
        text = json.dumps(document, indent=2, sort_keys=True)
        Path(report).write_text(text + "\n")
        print(f"\nreliability figures ({report}):\n{text}")


@pytest.fixture(scope="session")
def tfs(reference_serving: LocalServer) -> LocalServer:
    """The run's local TF Serving (tests/conftest.py), with `detector` (uint8 pixels)
    version 1 among its models: these tests only send it Predicts (the faults are put in
    front of it; test_faults starts its own to kill)."""
    return reference_serving


@pytest.fixture(scope="session")
def small_scene() -> tuple[bytes, int]:
    """A small PNG with known rectangles, and how many the detector must find."""
    scene = scenes.generate_scene(np.random.default_rng(7), 160, 120, 2)
    return scenes.encode(scene.pixels, "PNG"), len(scene.boxes)


@pytest.fixture(scope="session")
def request_small(small_scene: tuple[bytes, int]) -> pb.DetectRequest:
    return pb.DetectRequest(image=small_scene[0])
