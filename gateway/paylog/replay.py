"""A payload log back into `detection-batch` inputs: `python -m gateway.paylog replay LOG OUT`.

LOG is a log file, a directory or prefix of them (rotated files and objects included, read
in name order) or a glob; a local path or any fsspec URL. A batch job runs one task on one
model version with one set of options, so the records are grouped by those (the version is
the one that answered, so a replay asks the same version even after a rollout moved on) and
each group becomes a directory of OUT:

    OUT/replay.json                the groups, each with its detection-batch command, and
                                   every record that cannot be replayed, with the reason
    OUT/inputs/NNN-<task>-<model>-<version>/requests.jsonl
                                   a detection-batch manifest, one image per line in log
                                   order: {"image_bytes": ...} or {"image": <file>}, "id"
                                   the logged request id, "event" the CloudEvent's id
    OUT/inputs/NNN-.../expected.jsonl
                                   what the gateway answered, line for line: {"id", "code",
                                   "result"} or {"id", "code", "error"}
    OUT/results/NNN-.../           where each group's command writes its results (outside
                                   the inputs: detection-batch refuses an OUTPUT in INPUT)

Images: a record logged with images = "full" carries its image (checked against its
SHA-256). One logged with images = "hash" carries only the hash; with `--images DIR` (a
directory or prefix holding images named by their SHA-256, any extension) the manifest
names that file; without it, or when DIR has no such file, the record is skipped and
replay.json says so.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import posixpath
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.api import pipelines
from gateway.api.arguments import option_flag
from gateway.api.bindings import Bindings
from gateway.jobs.runner import storage
from gateway.paylog.events import SPECVERSION, TYPE

# A log line holds at most one image (32 MiB by default) as base64, plus the rest.
DEFAULT_MAX_LINE = (32 * 1024 * 1024 + 2) // 3 * 4 + 1024 * 1024
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Groups (open manifest files) at once; a log whose options vary per request past this is
# replayed in parts (its further records are listed as skipped, with this reason).
MAX_GROUPS = 256
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class ReplayError(Exception):
    """A log or images directory that cannot be read; the message says which."""


@dataclass
class Group:
    directory: str
    task: str  # the binding's verb, as detection-batch's --task takes it ("pipeline": --pipeline)
    model: str
    version: int | None
    label: str | None
    options: dict[str, Any]
    files: list[Any] = field(default_factory=list)  # requests.jsonl, expected.jsonl (open)
    records: int = 0

    def add(self, request: dict[str, Any], answer: dict[str, Any]) -> None:
        for file, line in zip(self.files, (request, answer), strict=True):
            file.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
        self.records += 1

    def command(self, out: str) -> list[str]:
        args = ["detection-batch", posixpath.join(out, self.directory, "requests.jsonl"),
                posixpath.join(out, "results", self.directory.split("/")[-1]),
                "--target", "HOST:PORT"]  # fmt: skip
        if self.task == pipelines.TASK:  # a pipeline: its name, its config names its models
            args += ["--pipeline", self.model]
        else:
            args += ["--task", self.task, "--model", self.model]
        if self.version is not None:
            args += ["--version", str(self.version)]
        elif self.label:
            args += ["--label", self.label]
        for name, value in sorted(self.options.items()):
            args += [option_flag(name), str(value)]  # as the flag takes it
        return args


def _lines(fs: Any, path: str, max_line: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number from 1, line) for each line; None for one over `max_line` bytes."""
    with fs.open(path, "rb") as stream:
        number = 0
        while True:
            line = stream.readline(max_line + 1)
            if not line:
                return
            number += 1
            if len(line) > max_line and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):  # skip the rest of it unread
                    line = stream.readline(1024 * 1024)
                yield number, None
                continue
            yield number, line.rstrip(b"\r\n")


def _log_files(log: str) -> tuple[storage.Location, list[str]]:
    location = storage.resolve(log)
    fs = location.fs
    try:
        if any(c in log for c in storage.GLOB_CHARS):
            paths = fs.glob(location.path)
        elif fs.isdir(location.path):
            paths = fs.find(location.path)
        else:
            paths = [location.path] if fs.exists(location.path) else []
    except OSError as e:
        raise ReplayError(f"cannot list {log}: {e}") from None
    if not paths:
        raise ReplayError(f"no payload log at {log}")
    return location, sorted(paths)


def _image_index(images: str) -> dict[str, str]:
    location = storage.resolve(images)
    try:
        paths = location.fs.find(location.path)
    except OSError as e:
        raise ReplayError(f"cannot list the images directory {images}: {e}") from None
    index: dict[str, str] = {}
    for path in paths:
        stem = posixpath.basename(path).split(".", 1)[0].lower()
        if _SHA256.match(stem):
            index.setdefault(stem, location.url(path))
    return index


class Groups(dict[tuple[Any, ...], Group]):
    """The groups by (task, model, version, label, options), their files open under OUT."""

    def __init__(self, target: storage.Location) -> None:
        super().__init__()
        self.target = target

    def open(self, key: tuple[Any, ...], task: str, model: str, *rest: Any) -> Group:
        name = _UNSAFE.sub("_", f"{len(self):03d}-{task}-{model}-{rest[0] or rest[1]}")
        group = self[key] = Group(f"inputs/{name}", task, model, *rest)
        base = self.target.child(group.directory)
        self.target.fs.makedirs(base, exist_ok=True)
        for file in ("requests.jsonl", "expected.jsonl"):
            group.files.append(self.target.fs.open(posixpath.join(base, file), "wb"))
        return group

    def close(self) -> None:
        for group in self.values():
            for file in group.files:
                file.close()


def replay(
    log: str,
    out: str,
    bindings: Bindings,
    images: str | None = None,
    max_line: int = DEFAULT_MAX_LINE,
) -> dict[str, Any]:
    """Writes OUT (see the module's docstring); returns what replay.json holds."""
    location, paths = _log_files(log)
    index = _image_index(images) if images else None
    target = storage.resolve(out)
    groups = Groups(target)
    skipped: list[dict[str, Any]] = []
    try:
        for path in paths:
            where = location.url(path)
            for number, line in _lines(location.fs, path, max_line):
                place = f"{where}:{number}"
                if line is None:
                    skipped.append({"line": place, "reason": f"line over {max_line} bytes"})
                    continue
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except (ValueError, UnicodeDecodeError) as e:
                    skipped.append({"line": place, "reason": f"not JSON: {e}"})
                    continue
                problem = _add(event, groups, bindings, index)
                if problem:
                    found: dict[str, Any] = {"line": place, "reason": problem}
                    if isinstance(event, dict) and isinstance(event.get("requestid"), str):
                        found["request_id"] = event["requestid"]
                    skipped.append(found)
    finally:
        groups.close()
    summary: dict[str, Any] = {"log": log, "groups": [], "skipped": skipped}
    for group in groups.values():
        summary["groups"].append({
            "directory": group.directory, "records": group.records, "task": group.task,
            "model": group.model, "version": group.version, "label": group.label,
            "options": group.options, "command": shlex.join(group.command(target.url())),
        })  # fmt: skip
    target.fs.makedirs(target.path, exist_ok=True)
    target.fs.pipe_file(target.child("replay.json"), json.dumps(summary, indent=2).encode())
    return summary


def _add(
    event: Any,
    groups: Groups,
    bindings: Bindings,
    index: Mapping[str, str] | None,
) -> str:
    """Adds the event's record to its group; the reason it cannot be replayed, or ""."""
    if not isinstance(event, dict) or event.get("type") != TYPE:
        return f"not a payload log event (type {TYPE})"
    if event.get("specversion") != SPECVERSION:
        return f"CloudEvents specversion {event.get('specversion')!r}, not {SPECVERSION}"
    try:
        data = event["data"]
        request, response = data["request"], data["response"]
        task, image, asked = event["task"], request["image"], request["model"]
        digest = str(image["sha256"])
    except (KeyError, TypeError):
        return "the event lacks data.request, data.response or their fields"
    try:
        binding = pipelines.binding(bindings) if task == pipelines.TASK else bindings.for_task(task)
    except KeyError:
        return f"task {task!r} is not one of {', '.join(b.task for b in bindings)}"
    line: dict[str, Any]
    if "data" in image:
        try:
            raw = base64.b64decode(image["data"], validate=True)
        except (binascii.Error, ValueError, TypeError):
            return "the image's data is not base64"
        if hashlib.sha256(raw).hexdigest() != digest:
            return "the image's data does not match its sha256 (damaged record)"
        line = {"image_bytes": image["data"]}
    elif index is not None and digest in index:
        line = {"image": index[digest]}
    elif index is not None:
        return f"only the image's sha256 {digest} is logged and --images has no file of that name"
    else:
        return (
            f'only the image\'s sha256 {digest} is logged (images = "hash"); log with '
            'images = "full", or give --images DIR holding the image as DIR/<sha256>'
        )
    served = response.get("model") or {}
    version = served.get("version") or asked.get("version")
    label = None if version else asked.get("label")
    model = served.get("name") or asked.get("name") or ""
    if task == pipelines.TASK:  # asked by name; the models that answered are its config's
        model, version, label = asked.get("name") or "", None, None
    options = {k: v for k, v in (request.get("options") or {}).items() if k in binding.options}
    key = (binding.verb, model, version, label, tuple(sorted(options.items())))
    group = groups.get(key)
    if group is None:
        if len(groups) >= MAX_GROUPS:
            return (
                f"the log has more than {MAX_GROUPS} combinations of task, model version and "
                "options; replay it in parts"
            )
        group = groups.open(key, binding.verb, model, version, label, options)
    request_id = request.get("request_id", "")
    line.update(id=request_id, event=event.get("id", ""))
    answer = {"id": request_id, "code": response.get("code")}
    if "result" in response:
        answer["result"] = response["result"]
    else:
        answer["error"] = response.get("error")
    group.add(line, answer)
    return ""
