"""The typed round trip of rendered objects through the `kubernetes` client's models, which
reports unknown fields and wrong types (tests/k8s/test_manifests.py, test_overlays.py)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pydantic

from tests.support.renders import Obj, ident

# API groups whose types the kubernetes client models; anything else needs its own schema.
CORE_GROUPS = {
    "", "apps", "autoscaling", "policy", "batch", "networking.k8s.io", "rbac.authorization.k8s.io",
    "admissionregistration.k8s.io",
}  # fmt: skip


# resource.Quantity: the API accepts a JSON number as well as a string; the client's models
# want the string, so numbers are converted before validation instead of being reported.
QUANTITY_MAPS = {"requests", "limits"}


QUANTITY_FIELDS = {"sizeLimit"}


@functools.cache
def api_client() -> kubernetes.client.ApiClient:
    return kubernetes.client.ApiClient()


def model_name(obj: Obj) -> str:
    """apps/v1 Deployment -> V1Deployment, autoscaling/v2 HorizontalPodAutoscaler -> V2H..."""
    version = obj["apiVersion"].rpartition("/")[2]
    return version[:1].upper() + version[1:] + obj["kind"]


def _quantities_as_strings(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        if key in QUANTITY_MAPS:
            return {k: str(v) if isinstance(v, int | float) else v for k, v in value.items()}
        return {k: _quantities_as_strings(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_quantities_as_strings(v) for v in value]
    if key in QUANTITY_FIELDS and isinstance(value, int | float):
        return str(value)
    return value


def _differences(original: Any, roundtrip: Any, path: str) -> Iterator[str]:
    if isinstance(original, dict):
        if not isinstance(roundtrip, dict):
            yield f"{path}: is an object, the schema wants {type(roundtrip).__name__}"
            return
        for key, value in original.items():
            where = f"{path}.{key}"
            if key in roundtrip:
                yield from _differences(value, roundtrip[key], where)
            elif value is None:
                yield f"{where}: null (write {{}} for an empty object, or leave the key out)"
            else:
                yield f"{where}: unknown field (misspelled, or not in this API version)"
        for key in roundtrip.keys() - original.keys():
            yield f"{path}.{key}: appeared in the round trip (unexpected default)"
    elif isinstance(original, list):
        if not isinstance(roundtrip, list) or len(roundtrip) != len(original):
            yield f"{path}: the list did not survive the round trip"
            return
        for i, (a, b) in enumerate(zip(original, roundtrip, strict=True)):
            yield from _differences(a, b, f"{path}[{i}]")
    elif type(original) is not type(roundtrip) or original != roundtrip:
        yield f"{path}: {original!r} came back as {roundtrip!r} (wrong type for the field)"


def kubernetes_schema_problems(obj: Obj) -> list[str]:
    """Unknown fields and wrong types in a core object, by a round trip through its model.

    The typed models keep only the fields the API defines (unknown keys are silently
    dropped by `from_dict`) and reject wrong types; serializing back and comparing with the
    input turns every dropped key into a reported problem.
    """
    name = model_name(obj)
    where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    if not hasattr(kubernetes.client, name):
        return [f"{where}: {obj['apiVersion']} {obj['kind']} is not a Kubernetes API type"]
    original = _quantities_as_strings(obj)
    api = api_client()
    try:
        model = api._ApiClient__deserialize(original, name)
    except pydantic.ValidationError as e:
        # The location is relative to the innermost model (e.title); a required field that is
        # absent reaches the model as None.
        return [
            f"{where}: in {e.title}: {'.'.join(map(str, err['loc']))}: "
            + ("required field is missing" if err.get("input") is None else err["msg"])
            for err in e.errors()
        ]
    except (ValueError, TypeError):
        # Clients generated without pydantic raise a bare ValueError (int("grpc"), or a
        # required field set to None) that names no model: find the innermost one that fails.
        return [f"{where}: {problem}" for problem in _conversion_problems(original, name)]
    return list(_differences(original, api.sanitize_for_serialization(model), where))


_REQUIRED = re.compile(r"Invalid value for `(\w+)`, must not be `None`")


def _conversion_problems(data: Any, klass: str) -> list[str]:
    """`in <Model>: <field>: <problem>` for the innermost models that refuse `data`."""
    if data is None:
        return []
    if klass.startswith("list["):
        items = data if isinstance(data, list) else []
        return [p for item in items for p in _conversion_problems(item, klass[5:-1])]
    if klass.startswith("dict["):
        values = data.values() if isinstance(data, dict) else []
        value_type = klass[5:-1].partition(", ")[2]
        return [p for value in values for p in _conversion_problems(value, value_type)]
    model = getattr(kubernetes.client.models, klass, None)
    if model is None or not isinstance(data, dict):
        return []  # primitives are reported by the model that holds them
    problems = []
    for attr, attr_type in model.openapi_types.items():
        key = model.attribute_map[attr]
        if key not in data:
            continue
        inner = _conversion_problems(data[key], attr_type)
        if inner:
            problems += inner
            continue
        try:
            api_client()._ApiClient__deserialize(data[key], attr_type)
        except (ValueError, TypeError) as e:
            problems.append(f"in {klass}: {key}: {data[key]!r} is not a valid {attr_type} ({e})")
    if problems:
        return problems
    try:
        api_client()._ApiClient__deserialize(data, klass)
    except (ValueError, TypeError) as e:
        required = _REQUIRED.search(str(e))
        if required:
            field_name = model.attribute_map.get(required.group(1), required.group(1))
            return [f"in {klass}: {field_name}: required field is missing"]
        return [f"in {klass}: {e}"]
    return []


def is_kubernetes_kind(obj: Obj) -> bool:
    return obj["apiVersion"].rpartition("/")[0] in CORE_GROUPS


def typed(obj: Obj) -> Any:
    """The kubernetes client's model of a rendered object (V1Deployment, V1NetworkPolicy, ...)."""
    assert kubernetes_schema_problems(obj) == [], ident(obj)
    return api_client()._ApiClient__deserialize(_quantities_as_strings(obj), model_name(obj))
