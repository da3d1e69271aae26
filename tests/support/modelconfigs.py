"""Model config files for the tests of gateway/models (tests/models): the built-in tasks'
config readers, and a config file written beside a labels file and a label map."""

from __future__ import annotations

from pathlib import Path

from gateway.tasks.builtin import built_in_tasks

# The task names a model config may use: those of the gateway's task registry.
TASKS = built_in_tasks().config_readers


def config(tmp_path: Path, text: str) -> Path:
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    (tmp_path / "label_map.pbtxt").write_text("item { id: 1 name: 'person' }\n")
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path
