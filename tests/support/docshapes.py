"""What the docs show a command answers, as a shape to check the real answer against.

The docs abbreviate answers: `{"instances": [{"keypoints": [{"name": "nose", "x", "y", "score"},
...]}], "skeleton": [...]}` names keys without values, `...` stands for more keys or items, and
`[h, w]` names values. `parse` reads that notation (the longest value at the start of a
comment; prose after it is ignored) and `mismatches` lists where a real JSON answer differs:
a key the doc names is missing, or a value is not of the type the doc shows (a string, a
number, a list, an object). Values themselves are examples and not compared.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_TOKEN = re.compile(
    r"""\s*(?:(?P<punct>[{}\[\]:,])|(?P<dots>\.\.\.)|(?P<string>"(?:[^"\\]|\\.)*"|'[^']*')"""
    r"""|(?P<number>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)|(?P<word>[A-Za-z_][\w.]*))"""
)


@dataclass(frozen=True)
class Shape:
    """A value as the doc shows it: kind is object, array, string, number, bool, null or any
    (a name such as `h`); `keys` the object's keys (None: no value shown); `items` an array's
    shown items."""

    kind: str
    keys: dict[str, Shape | None] = field(default_factory=dict)
    items: tuple[Shape, ...] = ()


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                break
            kind = m.lastgroup or ""
            self.tokens.append((kind, m[kind], m.end()))
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str]:
        if self.i >= len(self.tokens):
            raise ValueError("the shape ends early")
        kind, text, _ = self.tokens[self.i]
        return kind, text

    def take(self, expected: str | None = None) -> tuple[str, str]:
        kind, text = self.peek()
        if expected is not None and text != expected:
            raise ValueError(f"expected {expected!r}, found {text!r}")
        self.i += 1
        return kind, text

    def value(self) -> Shape:
        kind, text = self.take()
        if text == "{":
            return self.members()
        if text == "[":
            return self.elements()
        if kind == "string":
            return Shape("string")
        if kind == "number":
            return Shape("number")
        if kind == "dots":
            return Shape("any")
        if text in ("true", "false", "True", "False"):
            return Shape("bool")
        if text in ("null", "None"):
            return Shape("null")
        if kind == "word":
            return Shape("any")
        raise ValueError(f"unexpected {text!r}")

    def members(self) -> Shape:
        keys: dict[str, Shape | None] = {}
        while self.peek()[1] != "}":
            kind, text = self.take()
            if kind == "string":
                value = None
                if self.peek()[1] == ":":
                    self.take(":")
                    value = self.value()
                keys[text[1:-1]] = value
            elif kind != "dots":
                raise ValueError(f"a key, not {text!r}")
            if self.peek()[1] == ",":
                self.take(",")
        self.take("}")
        return Shape("object", keys)

    def elements(self) -> Shape:
        items: list[Shape] = []
        while self.peek()[1] != "]":
            if self.peek()[0] == "dots":
                self.take()
            else:
                items.append(self.value())
            if self.peek()[1] == ",":
                self.take(",")
        self.take("]")
        return Shape("array", items=tuple(items))


def parse(comment: str) -> Shape | None:
    """The shape at the start of a comment, or None when it does not start with one."""
    if comment[:1] not in ("{", "["):
        return None
    try:
        return _Parser(comment).value()
    except (ValueError, IndexError):
        return None


def mismatches(answer: Any, shape: Shape, path: str = "$") -> list[str]:
    """Where `answer` (parsed JSON) differs from `shape`; empty when it has the shape."""
    if shape.kind == "any":
        return []
    if shape.kind == "object":
        if not isinstance(answer, dict):
            return [f"{path}: an object in the doc, {type(answer).__name__} in the answer"]
        found = []
        for key, value in shape.keys.items():
            if key not in answer:
                found.append(f"{path}: no key {key!r} (keys: {sorted(answer)})")
            elif value is not None:
                found += mismatches(answer[key], value, f"{path}.{key}")
        return found
    if shape.kind == "array":
        if not isinstance(answer, list):
            return [f"{path}: a list in the doc, {type(answer).__name__} in the answer"]
        if shape.items and not answer:
            return [f"{path}: the doc shows items, the answer has none"]
        return (
            [
                m
                for i, item in enumerate(answer)
                for m in mismatches(item, shape.items[0], f"{path}[{i}]")
            ]
            if shape.items
            else []
        )
    expected = {"string": str, "bool": bool, "null": type(None)}
    if shape.kind == "number":
        ok = isinstance(answer, int | float) and not isinstance(answer, bool)
    else:
        ok = isinstance(answer, expected[shape.kind])
    return [] if ok else [f"{path}: a {shape.kind} in the doc, {answer!r} in the answer"]


def json_values(text: str) -> list[Any]:
    """The JSON values of a command's output, one after another (a stream's messages, JSON
    Lines); ValueError when the output is not JSON."""
    decoder = json.JSONDecoder()
    values = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        value, pos = decoder.raw_decode(text, pos)
        values.append(value)
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return values
