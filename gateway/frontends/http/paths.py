"""The model a prediction route's path names (`/v1/models/{model}[/versions/{n} |
/labels/{label}]:verb`), and putting it into the request message."""

from __future__ import annotations

from dataclasses import dataclass

from gateway import errors
from gateway.domain import ModelRef
from gateway.frontends.http import bodies


@dataclass(frozen=True)
class PathModel:
    """The model as a route's path names it (segments as text)."""

    name: str
    version: str | None
    label: str | None

    def ref(self) -> ModelRef:
        if self.version is None:
            return ModelRef(self.name, None, self.label)
        try:
            version = int(self.version)
        except ValueError:
            raise errors.invalid_input(
                f"version in the path must be a whole number, got {self.version!r}; use "
                "/labels/{label} for a version label"
            ) from None
        return ModelRef(self.name, version, None)


def set_path_model(message: bodies.ApiRequest, model: ModelRef) -> None:
    """The path names the model; a body may repeat it but not name another."""
    spec = message.model
    if spec.name and spec.name != model.name:
        raise errors.invalid_input(
            f"the body names model '{spec.name}' but the path names '{model.name}'; "
            "leave model out of the body or make them the same"
        )
    spec.name = model.name
    if model.version is not None:
        spec.version = model.version
    elif model.label is not None:
        spec.label = model.label
