"""Dockerfile.gateway cannot be built here (no container engine), so it is kept honest by
reading: what it copies exists, what it runs is ours or the base image's, it installs exactly
the locked light runtime and `jobs` extra (no TensorFlow), and its user, ports and entry point
match the gateway.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from gateway.config import Settings
from tests.support.dockerimage import (
    JOBS_LOCK,
    LOCK,
    closure,
    lock,
    lock_entries,
    normalize,
)

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile.gateway").read_text()
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Programs a RUN line may start: the base image's Python tools and user management.
BASE_IMAGE_COMMANDS = {"pip", "python", "useradd"}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def runtime_closure() -> set[str]:
    """The project's runtime dependencies and theirs, as installed in this environment."""
    return closure(PROJECT["dependencies"])


def jobs_closure() -> set[str]:
    """The `jobs` extra and what it pulls in beyond the runtime."""
    return closure(PROJECT["optional-dependencies"]["jobs"]) - runtime_closure()


def test_base_image_is_a_pinned_slim_python() -> None:
    arg = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert arg, "the base image is not an ARG with a default"
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", arg.group(1))
    stages = [rest for keyword, rest in instructions() if keyword == "FROM"]
    assert len(stages) >= 2, "multi-stage: build tools stay out of the runtime image"
    assert all(stage.split()[0] == "${PYTHON_IMAGE}" for stage in stages)


def test_every_copied_path_exists() -> None:
    copies = [rest for keyword, rest in instructions() if keyword == "COPY"]
    assert copies
    for rest in copies:
        if rest.startswith("--from="):
            continue
        *sources, _target = rest.split()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"


def test_generated_protos_are_copied() -> None:
    copied_dirs = [
        rest.split()[0] for keyword, rest in instructions() if keyword == "COPY" and "/" in rest
    ]
    assert "gateway/" in copied_dirs
    assert (ROOT / "gateway/proto/detection/v1/detection_pb2.py").is_file()


def test_every_run_command_is_provided() -> None:
    runs = [rest for keyword, rest in instructions() if keyword == "RUN"]
    assert runs
    for run in runs:
        for command in re.split(r"&&|\|\||;", run):
            words = [w for w in command.split() if not re.fullmatch(r"[A-Z_]+=\S*", w)]
            assert words[0] in BASE_IMAGE_COMMANDS, f"RUN {command.strip()}"
            if words[0] == "python" and words[1] == "-c":
                assert "import gateway" in command


def constraints() -> dict[str, str]:
    return {
        normalize(name): version
        for name, _, version in (
            line.partition("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
        )
    }


def test_the_lock_is_exactly_the_light_runtime_at_the_constrained_versions() -> None:
    pins = lock()
    assert set(pins) == runtime_closure()
    for name, version in pins.items():
        assert constraints().get(name) == version, f"{name}=={version} is not in constraints.txt"
    assert not {"tensorflow", "tensorflow-serving-api", "keras"} & set(pins)


def test_the_jobs_lock_is_exactly_the_jobs_extra_beyond_the_runtime() -> None:
    pins = lock(JOBS_LOCK)
    assert set(pins) == jobs_closure()
    for name, version in pins.items():
        assert constraints().get(name) == version, f"{name}=={version} is not in constraints.txt"
    # The extra's own pins are the versions the lock installs.
    for requirement in map(Requirement, PROJECT["optional-dependencies"]["jobs"]):
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"{requirement}: pin the jobs extra exactly"
        assert pins[normalize(requirement.name)] == spec.version, requirement
    assert not {"tensorflow", "tensorflow-serving-api", "keras"} & set(pins)


@pytest.mark.parametrize("path", [LOCK, JOBS_LOCK], ids=lambda p: p.name)
def test_every_pin_has_hashes_for_both_architectures(path: Path) -> None:
    for words in lock_entries(path):
        hashes = [w for w in words[1:] if w.startswith("--hash=")]
        assert len(hashes) == len(words) - 1, words
        assert all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in hashes), words
        name = normalize(words[0].partition("==")[0])
        files = metadata.distribution(name).read_text("WHEEL") or ""
        # Pure-Python wheels are one file; compiled ones one per architecture (x86_64, aarch64).
        expected = 1 if "Root-Is-Purelib: true" in files else 2
        assert len(hashes) == expected, words[0]


def test_only_the_lock_is_installed() -> None:
    installs = [
        rest for keyword, rest in instructions() if keyword == "RUN" and "pip install" in rest
    ]
    assert installs
    for install in installs:
        command = install.split("&&")[0]
        # --no-deps everywhere: nothing but the lock's pins (and the gateway) gets in.
        assert "--no-deps" in command, command
    assert any(
        "--require-hashes -r requirements-gateway.txt -r requirements-jobs.txt" in i
        for i in installs
    )
    # Extras come in through their locks, never as `.[extra]` (which would resolve unpinned).
    assert not any(re.search(r"\.\[", i) for i in installs), "no extras in the image"


def test_the_import_checks_name_modules_that_exist() -> None:
    checks = [
        m.group(1)
        for keyword, rest in instructions()
        if keyword == "RUN"
        for m in re.finditer(r'python -c "import ([^"]+)"', rest)
    ]
    modules = [name.strip() for check in checks for name in check.split(",")]
    assert "gateway.app" in modules and "gateway.jobs.executors.kube" in modules
    for name in modules:
        assert importlib.util.find_spec(name) is not None, f"the image imports {name}: not found"


def test_runs_the_gateway_as_non_root_on_its_ports() -> None:
    entrypoint = next(rest for keyword, rest in instructions() if keyword == "ENTRYPOINT")
    assert json.loads(entrypoint) == ["python", "-m", "gateway"]
    assert (ROOT / "gateway" / "__main__.py").is_file()
    users = [rest for keyword, rest in instructions() if keyword == "USER"]
    assert users and users[-1].isdigit() and int(users[-1]) != 0
    exposed = {
        int(p) for keyword, rest in instructions() if keyword == "EXPOSE" for p in rest.split()
    }
    defaults = Settings()
    assert exposed == {defaults.port, defaults.http_port, defaults.metrics_port}


def test_the_built_gateway_has_the_page_s_scripts(tmp_path: Path) -> None:
    """The build stage's copies, built as its `pip install .` builds them: the wheel holds every
    .js and .html file under gateway/ (the page's and each task's renderer, the jobs view,
    read at import)."""
    steps = instructions()
    build_from, runtime_from = [i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"][:2]
    stage = steps[build_from:runtime_from]
    source = tmp_path / "src"
    for keyword, rest in stage:
        if keyword == "COPY":
            *paths, target = rest.split()
            for path in paths:
                into = source / target
                if (ROOT / path).is_dir():
                    shutil.copytree(ROOT / path, into, dirs_exist_ok=True)
                else:
                    into.mkdir(parents=True, exist_ok=True)
                    shutil.copy(ROOT / path, into)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(tmp_path / "wheel"), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    built = set(zipfile.ZipFile(wheel).namelist())
    scripts = {
        str(p.relative_to(ROOT))
        for pattern in ("*.js", "*.html")
        for p in (ROOT / "gateway").rglob(pattern)
    }
    assert {"gateway/frontends/http/page.js", "gateway/frontends/http/jobs_page.html"} <= scripts
    assert scripts <= built, scripts - built
