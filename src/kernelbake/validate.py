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
import reprlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kernelbake._suggest import did_you_mean
from kernelbake.errors import BadInput
from kernelbake.textfile import read_text

_E = TypeVar("_E", bound=enum.Enum)
_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")

# A message quotes what it refuses, but a value from a file can be a 256 KiB string or a list
# that aliases expand past memory (repr walks every element): quoted values are cut, at a
# cost that does not grow with the value.
_QUOTE = reprlib.Repr()
_QUOTE.maxstring = _QUOTE.maxother = 80
_QUOTE.maxlevel = 2
_QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxset = _QUOTE.maxdict = 4
MAX_QUOTED = 160


def quoted(value: Any, *, chars: int = 80) -> str:
    """``repr(value)``, cut: a string to its first ``chars`` characters (and its length), anything
    else to at most ``MAX_QUOTED`` characters (2 levels, 4 items, 80 characters a string). What a
    message may say about a value from outside."""
    if isinstance(value, str):
        if len(value) <= chars:
            return repr(value)
        head = repr(value[:chars])
        return f"{head[:-1]}...{head[-1]} ({len(value):,} characters)"
    text = _QUOTE.repr(value)
    return text if len(text) <= MAX_QUOTED else text[: MAX_QUOTED - 3] + "..."


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
            raise self.error(field, f"unknown value {quoted(value)}{did_you_mean(text, choices)}") from None

    def positive_int(self, value: Any, field: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise self.error(field, f"expected a positive integer, got {quoted(value)}")
        return value

    def non_negative_int(self, value: Any, field: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self.error(field, f"expected an integer >= 0, got {quoted(value)}")
        return value

    def boolean(self, value: Any, field: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(field, f"expected true or false, got {quoted(value)}")
        return value

    def seconds(self, value: Any, field: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise self.error(field, f"expected a non-negative number of seconds, got {quoted(value)}")
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

# An alias names its anchor's whole subtree again, so a few hundred bytes of anchors that alias
# each other nine times over ("billion laughs") stand for 10^9 values. PyYAML shares the nodes,
# but whatever walks or prints the document (str(), json.dumps, a message quoting the value) pays
# for every one: 5 GB and over a minute. The document as the aliases expand it is weighed, one
# per node and one per character of a scalar, and refused past this weight. A file without
# aliases weighs at most about twice its length, under this for any file ``textfile`` reads
# (256 KiB); the specs and policies shipped weigh under 2,000.
MAX_YAML_EXPANDED = 1 << 20


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


class _Refused(yaml.composer.ComposerError):
    """A well-formed document past a bound (depth, expanded weight, a recursive alias)."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses nesting deeper than ``MAX_YAML_DEPTH`` before recursing further,
    a document whose aliases expand it past ``MAX_YAML_EXPANDED``, an alias inside its own
    anchor, and a mapping that names a key twice (at any depth)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        # The weight composed so far, expanded; and each finished node's own expanded weight
        # (what an alias to it adds). A node still being composed has none yet.
        self._expanded = 0
        self._weights: dict[int, int] = {}

    def _refuse(self, problem: str, mark: Any) -> _Refused:
        return _Refused(None, None, problem, mark)

    def _weigh(self, weight: int, mark: Any) -> None:
        self._expanded += weight
        if self._expanded > MAX_YAML_EXPANDED:
            raise self._refuse(
                f"aliases expand the document past {MAX_YAML_EXPANDED:,} values and characters "
                "(an alias names its anchor's whole value again); write the values out",
                mark,
            )

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)  # the anchored node, or "undefined alias"
            weight = self._weights.get(id(node))
            if weight is None:
                raise self._refuse(
                    f"alias *{event.anchor} is inside its own anchor (a recursive value)", event.start_mark
                )
            self._weigh(weight, event.start_mark)
            return node
        before = self._expanded
        if isinstance(event, yaml.CollectionStartEvent):
            if self._depth >= MAX_YAML_DEPTH:
                raise self._refuse(f"nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark)
            self._depth += 1
            try:
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
        else:
            node = super().compose_node(parent, index)
        assert node is not None  # only an alias, a scalar or a collection starts a node
        self._weigh(1 + (len(node.value) if isinstance(node, yaml.ScalarNode) else 0), event.start_mark)
        self._weights[id(node)] = self._expanded - before
        return node

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
    The file is read within ``textfile``'s bounds and parsed within ``parse_yaml``'s."""
    p = Path(path)
    return parse_yaml(read_text(p, what, error=error_type), str(p), error_type=error_type)


def parse_yaml(text: str, name: str, *, error_type: type[BadInput] = BadInput) -> tuple[Any, Source]:
    """The document ``text`` and its ``Source``; ``name`` (a path) starts each message. It nests
    at most ``MAX_YAML_DEPTH`` deep, its aliases expand it to at most ``MAX_YAML_EXPANDED``, and
    no mapping names a key twice; otherwise ``error_type`` says ``name:line: ...``."""
    loader: _BoundedLoader | None = None
    node: yaml.Node | None = None
    try:
        # The reader checks the characters as it is built: a control character raises here.
        loader = _BoundedLoader(text)
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except _DuplicateKey as exc:
        assert node is not None  # composed before anything was constructed
        first, again = exc.first.start_mark.line + 1, exc.again.start_mark.line + 1
        raise error_type(
            f"{name}:{again}: {_field_of(node, exc.again)}: duplicate key {quoted(exc.key)}, "
            f"first at {name}:{first}",
            hint="keep one of them: YAML would keep the last value and drop the other without a word",
        ) from None
    except _Refused as exc:
        assert exc.problem_mark is not None  # every _Refused names where
        raise error_type(f"{name}:{exc.problem_mark.line + 1}: YAML refused: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error_type(f"{where}: malformed YAML: {problem}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, Source(name, error_type, node)
