"""Embedding's model-config keys, all in [models.NAME.outputs]: `embedding` (which output holds
the vector, where the signature does not settle it) and `normalize` (divide the vector by its
L2 norm; true by default)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.models.values import ModelConfigError
from gateway.tasks.base import read_outputs, read_own_keys

OUTPUT_KEYS = frozenset({"embedding", "normalize"})


@dataclass(frozen=True)
class EmbeddingConfig:
    embedding: str | None = None  # the output holding the vector; None: recognised
    normalize: bool = True


DEFAULT = EmbeddingConfig()


def read_config(table: Mapping[str, Any], path: Path, where: str) -> EmbeddingConfig:
    """[models.NAME] of an embedding model (`table`, at `where`); unknown keys refused by
    name, and labels, which a vector has none of."""
    for key in ("labels", "label_map"):
        if key in table:
            raise ModelConfigError(
                f"{path}: {where}.{key}: an embedding model has no classes to name; remove it"
            )
    read_own_keys(table, (), path, where)
    outputs, outputs_where = read_outputs(table, OUTPUT_KEYS, path, where)
    name = outputs.get("embedding")
    if name is not None and (not isinstance(name, str) or not name):
        raise ModelConfigError(
            f"{path}: {outputs_where}.embedding must name an output of the signature, got {name!r}"
        )
    normalize = outputs.get("normalize", True)
    if not isinstance(normalize, bool):
        raise ModelConfigError(
            f"{path}: {outputs_where}.normalize must be true or false, got {normalize!r}"
        )
    return EmbeddingConfig(embedding=name, normalize=normalize)
