"""`python -m tests.support.suitetime` measures `make test` as CI runs it: with envtest's API
server, found in ../shared beside the checkout, or beside the main checkout when it runs from a
git worktree (a first measurement from a worktree skipped envtest's 125 tests)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support import suitetime


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_envtest_is_found_beside_the_checkout_or_beside_the_main_one_of_a_worktree(
    tmp_path: Path,
) -> None:
    main = tmp_path / "main"
    main.mkdir()
    git("init", "-q", cwd=main)
    git(
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "x",
        cwd=main,
    )
    git("worktree", "add", "-q", str(tmp_path / "wt" / "lead"), cwd=main)
    assert suitetime.envtest(main) is None
    assert suitetime.envtest(tmp_path / "wt" / "lead") is None
    assets = tmp_path / "shared" / "envtest" / "bin"
    assets.mkdir(parents=True)
    assert suitetime.envtest(main) == assets
    assert suitetime.envtest(tmp_path / "wt" / "lead") == assets
