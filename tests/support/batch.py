"""Running detection-batch as a real process, and reading what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def command(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "gateway.jobs.runner", *args]


def env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    result = dict(os.environ)
    result.pop("JOB_COMPLETION_INDEX", None)
    result.pop("BATCH_SHARD_COUNT", None)
    result.update(extra or {})
    return result


def run(
    args: Sequence[str], timeout: float = 120, extra_env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(args), cwd=ROOT, env=env(extra_env), capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def start(
    args: Sequence[str], log: Path, extra_env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            command(args), cwd=ROOT, env=env(extra_env), stdout=out, stderr=subprocess.STDOUT
        )


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def ok(process: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert process.returncode == 0, process.stderr[-3000:]
    return dict(json.loads(process.stdout.strip().splitlines()[-1]))
