"""Frozen dataclasses ↔ JSON, derived from their fields, so that a field added to a contract
type is written and read without a second list of names to keep in step.

Each field's type gives its JSON form: ``str``, ``int`` and ``bool`` as themselves; an
``Enum`` as its value; a ``CacheKey`` as its canonical string; a nested dataclass as an
object; a tuple of ``(str, value)`` pairs as an object (read back sorted, as the contract
types hold them); any other tuple as an array. A ``str`` field whose metadata is
``EMBEDDED_JSON`` holds canonical JSON text and travels as the JSON value it encodes.
Reading refuses unknown keys, missing keys (unless the field has a default) and values of
another type, naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import typing
from typing import Any, TypeVar

from kernelbake.contract.key import CacheKey, InvalidKey, parse_key
from kernelbake.errors import BadInput

# Field metadata of a str holding canonical JSON (sorted keys, no spaces).
EMBEDDED_JSON = {"wire": "json"}

T = TypeVar("T")


class WireError(BadInput):
    """A JSON document that does not have the shape of its contract type."""


def to_wire(obj: Any) -> dict[str, Any]:
    """The JSON object for a contract dataclass."""
    return {f.name: _encode(getattr(obj, f.name), hint, f.metadata) for f, hint in _fields(type(obj))}


def from_wire(cls: type[T], doc: Any, *, source: str) -> T:
    """The dataclass ``cls`` read from the JSON value ``doc``; ``source`` names the file."""
    return _Reader(source).dataclass(cls, doc, "")


def _fields(cls: type) -> tuple[tuple[dataclasses.Field[Any], Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls))


def _pair_value(hint: Any) -> Any | None:
    """``V`` for ``tuple[tuple[str, V], ...]``; None for any other type."""
    args = typing.get_args(hint) if typing.get_origin(hint) is tuple else ()
    if len(args) != 2 or args[1] is not Ellipsis or typing.get_origin(args[0]) is not tuple:
        return None
    inner = typing.get_args(args[0])
    return inner[1] if len(inner) == 2 and inner[0] is str else None


def _item_hints(hint: Any, n: int) -> list[Any]:
    """The item types of ``n`` items of a ``tuple[X, ...]`` or a ``tuple[X, Y, ...]``."""
    args = typing.get_args(hint)
    return [args[0]] * n if len(args) == 2 and args[1] is Ellipsis else list(args)


def _encode(value: Any, hint: Any, metadata: Any = None) -> Any:
    if metadata == EMBEDDED_JSON:
        return json.loads(value)
    if isinstance(value, CacheKey):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_wire(value)
    if isinstance(value, tuple):
        pair_value = _pair_value(hint)
        if pair_value is not None:
            return {k: _encode(v, pair_value) for k, v in value}
        return [_encode(v, h) for v, h in zip(value, _item_hints(hint, len(value)), strict=True)]
    return value


_KIND_NAMES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, path: str, message: str) -> WireError:
        return WireError(f"{self.source}: {path}: {message}" if path else f"{self.source}: {message}")

    def dataclass(self, cls: type[T], doc: Any, path: str) -> T:
        obj = self.typed(doc, dict, path)
        fields = _fields(cls)
        known = {f.name for f, _ in fields}
        for k in obj:
            if k not in known:
                raise self.error(_join(path, str(k)), "unknown key")
        values: dict[str, Any] = {}
        for f, hint in fields:
            where = _join(path, f.name)
            if f.name in obj:
                values[f.name] = self.value(obj[f.name], hint, where, f.metadata)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise self.error(where, "missing")
        return cls(**values)

    def value(self, raw: Any, hint: Any, path: str, metadata: Any = None) -> Any:
        if metadata == EMBEDDED_JSON:
            return json.dumps(raw, sort_keys=True, separators=(",", ":"))
        if hint is CacheKey:
            try:
                return parse_key(self.typed(raw, str, path))
            except InvalidKey as exc:
                raise self.error(path, str(exc)) from None
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            try:
                return hint(raw)
            except ValueError:
                choices = ", ".join(str(m.value) for m in hint)
                raise self.error(path, f"unknown value {raw!r} (expected one of {choices})") from None
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            return self.dataclass(hint, raw, path)
        if typing.get_origin(hint) is tuple:
            pair_value = _pair_value(hint)
            if pair_value is not None:
                obj = self.typed(raw, dict, path)
                return tuple(sorted((k, self.value(v, pair_value, _join(path, k))) for k, v in obj.items()))
            items = self.typed(raw, list, path)
            hints = _item_hints(hint, len(items))
            if len(hints) != len(items):
                raise self.error(path, f"expected {len(hints)} items, got {len(items)}")
            return tuple(
                self.value(v, h, f"{path}[{i}]") for i, (v, h) in enumerate(zip(items, hints, strict=True))
            )
        if hint in (str, int, bool):
            return self.typed(raw, hint, path)
        raise TypeError(f"{path}: no JSON form for {hint!r}")

    def typed(self, raw: Any, kind: type, path: str) -> Any:
        # bool is an int to Python, never to the contract.
        if not isinstance(raw, kind) or (kind is int and isinstance(raw, bool)):
            found = _KIND_NAMES.get(type(raw), type(raw).__name__)
            raise self.error(path, f"expected {_KIND_NAMES[kind]}, got {found}")
        return raw


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
