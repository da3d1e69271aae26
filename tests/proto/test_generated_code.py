"""The committed gateway/proto/ is exactly what `make proto` generates from proto/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "gateway" / "proto"


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    out = tmp_path / "proto"
    subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    fresh = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    committed = {
        p.relative_to(COMMITTED): p.read_bytes()
        for p in COMMITTED.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert sorted(fresh) == sorted(committed), "run `make proto` and commit gateway/proto/"
    stale = [str(name) for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated files {stale}: run `make proto` and commit them"
