"""Validating YAML input (image specs, the verify policy, the admission policy): one message
format everywhere, ``file:line: field: message``, and one set of typed getters.

A ``Source`` says where values came from: a file with its YAML node tree (so messages carry
line numbers), or only a name when a caller hands in a mapping built in Python. Field paths are
dotted, with list indices: ``identities[0].subject``; ``child`` scopes a source to one part of
the document (the admission policy's ``verify:`` section is the signing policy verbatim).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kernelbake._suggest import did_you_mean
from kernelbake.errors import BadInput
from kernelbake.textfile import read_text

_E = TypeVar("_E", bound=enum.Enum)
_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


@dataclasses.dataclass(frozen=True)
class Source:
    name: str
    error_type: type[BadInput] = BadInput
    node: yaml.Node | None = dataclasses.field(default=None, compare=False, repr=False)
    prefix: str = ""

    def path(self, field: str = "") -> str:
        """``field`` under this source's prefix."""
        if not self.prefix or not field:
            return self.prefix or field
        return f"{self.prefix}{field}" if field.startswith("[") else f"{self.prefix}.{field}"

    def child(self, field: str) -> Source:
        return dataclasses.replace(self, prefix=self.path(field))

    def with_error(self, error_type: type[BadInput]) -> Source:
        return dataclasses.replace(self, error_type=error_type)

    def line(self, path: str) -> int | None:
        """The line of ``path``, or of its closest ancestor present in the file."""
        node = self.node
        if node is None:
            return None
        line = node.start_mark.line + 1
        for key, index in _PART.findall(path):
            if key and isinstance(node, yaml.MappingNode):
                found = next((kv for kv in node.value if getattr(kv[0], "value", None) == key), None)
                if found is None:
                    break
                line, node = found[0].start_mark.line + 1, found[1]
            elif index and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
                node = node.value[int(index)]
                line = node.start_mark.line + 1
            else:
                break
        return line

    def where(self, field: str = "") -> str:
        """``file:line: field`` (``name: field`` without a file)."""
        path = self.path(field)
        line = self.line(path)
        head = f"{self.name}:{line}" if line else self.name
        return f"{head}: {path}" if path else head

    def error(self, field: str, message: str, *, hint: str | None = None) -> BadInput:
        return self.error_type(f"{self.where(field)}: {message}", hint=hint)

    # -- typed getters: each returns the value checked, or raises naming file:line: field --

    def mapping(
        self, value: Any, field: str, allowed: Iterable[str], required: Iterable[str] = ()
    ) -> Mapping[str, Any]:
        """A mapping with only ``allowed`` keys (an unknown one gets the closest valid name)
        and every ``required`` one."""
        if not isinstance(value, Mapping):
            raise self.error(field, f"expected a mapping, got {type(value).__name__}")
        known = set(allowed)
        for k in value:
            if k not in known:
                raise self.error(_join(field, str(k)), f"unknown key{did_you_mean(str(k), known)}")
        for k in sorted(required):
            if k not in value:
                raise self.error(field, f"missing required key {self.path(_join(field, k))}")
        return value

    def enum(
        self,
        cls: type[_E],
        value: Any,
        field: str,
        *,
        aliases: Mapping[str, str] | None = None,
        fold_case: bool = False,
    ) -> _E:
        """The member whose wire value is ``value`` (after ``aliases``; ``fold_case`` also takes
        upper case); a YAML null reads as ``none``."""
        text = "none" if value is None else str(value)
        text = text.lower() if fold_case else text
        text = (aliases or {}).get(text, text)
        try:
            return cls(text)
        except ValueError:
            choices = [str(m.value) for m in cls]
            raise self.error(field, f"unknown value {value!r}{did_you_mean(text, choices)}") from None

    def positive_int(self, value: Any, field: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise self.error(field, f"expected a positive integer, got {value!r}")
        return value

    def non_negative_int(self, value: Any, field: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self.error(field, f"expected an integer >= 0, got {value!r}")
        return value

    def seconds(self, value: Any, field: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise self.error(field, f"expected a non-negative number of seconds, got {value!r}")
        return float(value)

    def optional_list(self, value: Any, field: str) -> list[Any]:
        """A list; an absent (null) one is empty."""
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(field, f"expected a list, got {type(value).__name__}")
        return value


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


# Real documents nest a few levels; PyYAML composes nodes recursively, so a document nested
# thousands deep would end in a RecursionError. Past this depth the file is refused instead.
MAX_YAML_DEPTH = 64


class _DuplicateKey(yaml.YAMLError):
    """A mapping names one key twice; PyYAML would keep the last value and say nothing."""

    def __init__(self, key: Any, first: yaml.Node, again: yaml.Node) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key, self.first, self.again = key, first, again


def _field_of(root: yaml.Node, key_node: yaml.Node) -> str:
    """The field path (``a.b[0].c``) of ``key_node`` in the tree under ``root``: each node is
    visited once, aliases (which share nodes) and recursive anchors included."""
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    seen: set[int] = set()
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                field = _join(path, str(getattr(k, "value", "?")))
                if k is key_node:
                    return field
                stack.append((v, field))
        elif isinstance(node, yaml.SequenceNode):
            stack += [(v, f"{path}[{i}]") for i, v in enumerate(node.value)]
    return ""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses nesting deeper than ``MAX_YAML_DEPTH`` before recursing further,
    and a mapping that names a key twice (at any depth)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.CollectionStartEvent):
            if self._depth >= MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"nested deeper than {MAX_YAML_DEPTH} levels",
                    self.peek_event().start_mark,  # type: ignore[no-untyped-call]
                )
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Keys compared as constructed (`a` and `"a"`, `yes` and `true` are one key), before the
        # merge keys (`<<: *base`) are flattened in: overriding a merged key is what they are for.
        # Scalar keys only; an unhashable key is refused by the constructor itself.
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:
                continue
            if first is not key_node:
                raise _DuplicateKey(key, first, key_node)
        return super().construct_mapping(node, deep)


def load_yaml(path: str | Path, *, what: str, error_type: type[BadInput] = BadInput) -> tuple[Any, Source]:
    """The parsed document and its ``Source``; unreadable or malformed files raise
    ``error_type`` naming ``file:line``. ``what`` names the file in messages (spec, policy).
    The file is read within ``textfile``'s bounds and nests at most ``MAX_YAML_DEPTH`` deep."""
    p = Path(path)
    text = read_text(p, what, error=error_type)
    loader: _BoundedLoader | None = None
    try:
        # The reader checks the characters as it is built: a control character raises here.
        loader = _BoundedLoader(text)
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except _DuplicateKey as exc:
        assert node is not None  # composed before anything was constructed
        first, again = exc.first.start_mark.line + 1, exc.again.start_mark.line + 1
        raise error_type(
            f"{p}:{again}: {_field_of(node, exc.again)}: duplicate key {exc.key!r}, first at {p}:{first}",
            hint="keep one of them: YAML would keep the last value and drop the other without a word",
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error_type(f"{where}: malformed YAML: {problem}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, Source(str(p), error_type, node)
