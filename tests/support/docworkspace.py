"""Running the docs' command blocks as a user would (tests/docs/, tests/support/doccommands.py).

A `Workspace` is the directory a user pastes in: it holds the files the docs name (`FILES`),
and links to the repository's `.venv` and `serving/` and to `make run`'s models directory
(`models/samples/scene.jpg` is the sample `make run` wrote). Commands run there with `.venv/bin`
first on PATH (grpcurl, detection-batch and `python` are the venv's, as the docs say) and the
repository importable. What differs from the printed text is declared here, nothing else:

- `SUBSTITUTIONS`: the ports (`make run` runs on free ports in the tests), `/data/street`
  (a dataset directory under `make run`'s samples, the one place its jobs may read) and the
  model config `check-models` is given;
- `PLACEHOLDERS`: names the doc abbreviates (`operations/3fa1...`), taken from an earlier
  answer of the same block.

Each shell command runs alone (`bash -o pipefail -c`), so each is judged by itself: its exit
status, its output parsed as JSON when it is JSON (an `{"error": ...}` answer fails, curl exits
0 on it), and the shape of the answer when the doc shows one (tests/support/docshapes.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import docshapes
from tests.support.doccommands import PYTHON, ROOT, SHELL, Block, Command, shell_commands

# A command of the docs gets this long; a batch job's wait is the longest (60 s in the doc).
COMMAND_TIMEOUT = 120.0


def _scene(seed: int, width: int, height: int, fmt: str) -> bytes:
    import numpy as np

    from serving import scenes

    scene = scenes.generate_scene(np.random.default_rng(seed), width, height, 5, noise_sigma=6.0)
    return scenes.encode(scene.pixels, "JPEG" if fmt == "jpg" else "PNG")


# The files the docs name, made here: pictures of the palette rectangles the reference models
# know (the detector finds each, the classifiers rank their colours). big.png is one for which
# the doc passes the JSON on stdin: its base64 is over Linux's 128 KiB limit on one argument.
FILES: dict[str, Callable[[], bytes]] = {
    "street.jpg": lambda: _scene(7, 640, 480, "jpg"),
    "people.jpg": lambda: _scene(8, 640, 480, "jpg"),
    "cat.jpg": lambda: _scene(9, 320, 240, "jpg"),
    "cat.png": lambda: _scene(9, 320, 240, "png"),
    "a.jpg": lambda: _scene(10, 320, 240, "jpg"),
    "b.jpg": lambda: _scene(11, 320, 240, "jpg"),
    "c.jpg": lambda: _scene(12, 320, 240, "jpg"),
    "big.png": lambda: _scene(13, 1600, 1200, "png"),
}
# The dataset /data/street stands for: a few pictures in a directory.
DATASET = ("street.jpg", "a.jpg", "b.jpg", "c.jpg")


@dataclass(frozen=True)
class Ports:
    gateway: int
    http: int
    serving: int
    metrics: int


def substitutions(ports: Ports, dataset: Path, results: Path) -> list[tuple[re.Pattern[str], str]]:
    """What the docs print -> what the tests run (the whole list; nothing else changes)."""
    table = [
        # make run's ports are picked free in the tests (the Makefile's variables).
        (r"localhost:50051\b", f"localhost:{ports.gateway}"),
        (r"localhost:8080\b", f"localhost:{ports.http}"),
        (r"localhost:8500\b", f"localhost:{ports.serving}"),
        (r"localhost:9090\b", f"localhost:{ports.metrics}"),
        # A user's dataset: a directory under make run's samples (--batch-allowed-input-uris).
        (r"/data/street-results\b", str(results)),
        (r"/data/street\b", str(dataset)),
        # The model config check-models is given: make run's own.
        (r"(?<![\w/.-])models\.toml\b", str(ROOT / "serving" / "gateway-models.toml")),
    ]
    return [(re.compile(pattern), value) for pattern, value in table]


# Names the docs abbreviate -> where the value comes from: the first such field of an earlier
# answer of the same block (an operation's name, an upload's id, a results line's page token).
PLACEHOLDERS = {
    "3fa1...": "name",
    "9b2e...": "upload_id",
    "eyJr...": "page_token",
}


def _found(values: list[Any], key: str) -> str | None:
    """The first non-empty `key` in parsed answers, at any depth (an operation's name without
    its "operations/")."""
    stack = list(reversed(values))
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            found = value.get(key)
            if isinstance(found, str) and found:
                if key != "name":
                    return found
                if found.startswith("operations/"):
                    return found.removeprefix("operations/")
            stack.extend(reversed(list(value.values())))
        elif isinstance(value, list):
            stack.extend(reversed(value))
    return None


@dataclass
class Outcome:
    """One command's run: what was run, its exit status and output, the answers parsed."""

    command: str
    returncode: int
    stdout: str
    stderr: str
    values: list[Any] = field(default_factory=list)

    def report(self) -> str:
        return (
            f"$ {self.command}\nexit {self.returncode}\n"
            f"stdout: {self.stdout[-3000:]}\nstderr: {self.stderr[-3000:]}"
        )


class Workspace:
    """The directory a user pastes in, the substitutions and the environment."""

    def __init__(
        self,
        directory: Path,
        models: Path | None = None,
        ports: Ports | None = None,
        env: dict[str, str] | None = None,
        files: bool = True,
    ) -> None:
        """The files and links; with `make run`'s models and ports, its dataset and the
        substitutions too (without: commands run as printed, in `env`)."""
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        links = {".venv": ROOT / ".venv", "serving": ROOT / "serving"}
        if models is not None:
            links["models"] = models
        for name, target in links.items():
            link = directory / name
            if not link.exists():
                link.symlink_to(target.resolve())
        for name, make in FILES.items() if files else ():
            (directory / name).write_bytes(make())
        self.table: list[tuple[re.Pattern[str], str]] = []
        if models is not None and ports is not None:
            self.dataset = models / "samples" / "street"
            self.dataset.mkdir(parents=True, exist_ok=True)
            for name in DATASET:
                (self.dataset / name).write_bytes((directory / name).read_bytes())
            self.table = substitutions(ports, self.dataset, directory / "street-results")
        venv_bin = ROOT / ".venv" / "bin"
        self.env = {
            **os.environ,
            "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }

    def substitute(self, text: str) -> str:
        for pattern, value in self.table:
            text = pattern.sub(value, text)
        return text

    def run_shell(self, text: str, timeout: float = COMMAND_TIMEOUT) -> Outcome:
        return self._run(text, ["bash", "-o", "pipefail", "-c", text], None, timeout)

    def run_python(self, text: str, timeout: float = COMMAND_TIMEOUT) -> Outcome:
        return self._run(text, [str(ROOT / ".venv" / "bin" / "python"), "-"], text, timeout)

    def _run(self, text: str, argv: list[str], stdin: str | None, timeout: float) -> Outcome:
        """`argv` in the workspace with its environment; `text` is the block it runs."""
        result = subprocess.run(
            argv,
            input=stdin,
            cwd=self.directory,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return Outcome(text, result.returncode, result.stdout, result.stderr)


def _redirected(command: str) -> list[str]:
    """The files a command writes with > or >>."""
    return re.findall(r">>?\s*([\w./-]+)\s*$", command)


def run_block(
    workspace: Workspace, block: Block, rewrite: Callable[[str], str] = lambda text: text
) -> Iterator[tuple[Command | None, Outcome]]:
    """Runs a block: a shell block command by command, a Python block whole; yields each
    command with its outcome (`problems` judges it). `rewrite` is a check's own declared change
    of a command (envtest's --dry-run=server), after the substitutions."""
    if block.lang in PYTHON:
        yield None, workspace.run_python(workspace.substitute(block.text))
        return
    assert block.lang in SHELL, block
    known: dict[str, str] = {}
    for command in shell_commands(block):
        text = workspace.substitute(command.text)
        for placeholder, key in PLACEHOLDERS.items():
            if placeholder in text:
                if key not in known:
                    raise AssertionError(
                        f"{block.where}: line {command.line} uses {placeholder} before an "
                        f"answer of the block gave a {key}"
                    )
                text = text.replace(placeholder, known[key])
        outcome = workspace.run_shell(rewrite(text))
        outcome.values = _parsed(outcome.stdout)
        for path in _redirected(text):
            outcome.values += _parsed((workspace.directory / path).read_text())
        for key in PLACEHOLDERS.values():
            if key not in known and (value := _found(outcome.values, key)):
                known[key] = value
        yield command, outcome


def _parsed(output: str) -> list[Any]:
    if output.lstrip()[:1] not in ("{", "["):
        return []
    try:
        return docshapes.json_values(output)
    except ValueError:
        return []


def problems(block: Block, command: Command | None, outcome: Outcome) -> list[str]:
    """What is wrong with one command's run, each naming the doc's file:line."""
    where = f"{block.where}" if command is None else f"{block.page.name}:{command.line}"
    found = []
    if outcome.returncode != 0:
        found.append(f"{where}: exit {outcome.returncode}")
    if block.lang in PYTHON:
        if not outcome.stdout.strip():
            found.append(f"{where}: printed nothing")
        return [f"{p}\n{outcome.report()}" for p in found]
    text = outcome.stdout.strip()
    if text[:1] in ("{", "[") and not outcome.values:
        found.append(f"{where}: the answer is not JSON")
    for value in outcome.values:
        if isinstance(value, dict) and "error" in value and "error" not in command_shown(command):
            found.append(f"{where}: an error answer: {json.dumps(value['error'])[:300]}")
    shape = docshapes.parse(command.shown) if command and command.shown else None
    if command and command.shown and shape is None:
        found.append(f"{where}: the answer the doc shows cannot be read: {command.shown!r}")
    if shape is not None:
        if not outcome.values:
            found.append(f"{where}: the doc shows an answer, the command printed no JSON")
        for value in outcome.values:
            found += [f"{where}: {m}" for m in docshapes.mismatches(value, shape)]
    return [f"{p}\n{outcome.report()}" for p in found]


def command_shown(command: Command | None) -> str:
    return command.shown if command else ""
