"""The tasks the gateway serves: one line per task, its folder under gateway/tasks/.

Adding a task is its folder (task, config, binding, page), its proto and the generated code,
its tests and docs, and one line here (docs/adding-a-task.md)."""

from __future__ import annotations

import importlib

from gateway.api.task import Task, TaskRegistry

FOLDERS = (
    "detection",
    "classification",
    "embedding",
    "keypoints",
    "segmentation",
)


def built_in_tasks() -> TaskRegistry:
    """Every task of FOLDERS (each folder's package exports TASK)."""
    tasks: list[Task] = [importlib.import_module(f"gateway.tasks.{f}").TASK for f in FOLDERS]
    return TaskRegistry(tasks)


# The public API's tasks, as the gateway serves them and the client calls them.
BUILT_IN = built_in_tasks().bindings
