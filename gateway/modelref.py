"""The model a caller names: the one domain type every layer shares (the doors, the core,
the TF Serving client, batch jobs), so it lives below all of them."""

from __future__ import annotations

from typing import NamedTuple


class ModelRef(NamedTuple):
    """A model as a caller asks for it: a name and at most one of version or label.

    A NamedTuple: it is made, hashed and compared several times per image, as the key of
    the signature and request-envelope caches."""

    name: str
    version: int | None = None
    label: str | None = None

    def describe(self) -> str:
        if self.version is not None:
            return f"model '{self.name}' version {self.version}"
        if self.label is not None:
            return f"model '{self.name}' label '{self.label}'"
        return f"model '{self.name}'"
