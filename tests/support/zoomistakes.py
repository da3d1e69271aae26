"""The preprocessing mistakes a zoo model's answers must catch (channels swapped, the mean
dropped, the fast resize): a model config made wrong in one way, and the photos the DCT-scaled
decode changes."""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.zoo.compare import to_toml
from tests.zoo.conftest import CLASSIFIERS, MODEL_CONFIG


def _swap_channels(prep: dict[str, Any]) -> bool:
    prep["channel_order"] = "RGB" if prep.get("channel_order") == "BGR" else "BGR"
    return True


def _drop_mean(prep: dict[str, Any]) -> bool:
    return prep.pop("mean", None) is not None


def _fast_resize(prep: dict[str, Any]) -> bool:
    return prep.pop("resize_filter", None) is not None


MISTAKES: dict[str, Callable[[dict[str, Any]], bool]] = {
    "channels swapped": _swap_channels,
    "mean dropped": _drop_mean,
    "fast resize": _fast_resize,
}


# The photos the fast path decodes at a fraction of their size: where it must be caught.
DCT_SCALED = {"photo640x480", "photo1200x900", "exif6_600x800", "exif3_800x600"}


def wrong_config(
    mistake: str, directory: Path, models: tuple[str, ...] = CLASSIFIERS
) -> tuple[Path, list[str]]:
    """The zoo's model config with `mistake` made for every one of `models` it applies to."""
    config = tomllib.loads(MODEL_CONFIG.read_text())
    wrong = copy.deepcopy(config)
    changed = []
    for model in models:
        table = wrong["models"][model]
        if MISTAKES[mistake](table.setdefault("input", {})):
            changed.append(model)
    path = directory / "models.toml"
    path.write_text(to_toml(wrong))
    return path, changed
