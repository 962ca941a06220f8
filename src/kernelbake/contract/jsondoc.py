"""JSON from outside (a cache volume's manifest.json, a delta.json, registry manifests and listings,
attestations, admission reviews, files handed to ``check`` and ``capture``), parsed with its
nesting bounded.

Python's json recurses once per level: a 200,000-deep array ends in a ``RecursionError``
(a traceback, or a crash of whatever walks the result next), not in a parse error. ``loads``
measures the depth first, without recursing, and refuses a document nested deeper than
``MAX_JSON_DEPTH`` with a ``ValueError``, the error callers already turn into their own message
for malformed JSON. Host and image code both parse such input, so this lives in the contract.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kernelbake.errors import BadInput

# Deeper than any document kernelbake reads or writes: a cache manifest nests 4 levels, an OCI
# index 4, a pod spec with its managedFields under 30. Python's own scanner (the admission
# server's, for large bodies) takes about 3 frames a level, so 128 levels stay far inside the
# interpreter's default limit of 1,000 from wherever the parse is called.
MAX_JSON_DEPTH = 128

# Only quotes and brackets matter to the depth; each step below is one pass in C over bytes
# (regexes over the text cost twice as long on a 6 MB review: 0.8 s beside json's 3 s).
_DELETE = bytes(sorted(set(range(256)) - set(b'"[]{}')))
_SLICE = 1 << 16
# Opening brackets count +1, closing -1, as signed bytes.
_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


class TooDeep(ValueError):
    """A JSON document nested deeper than the bound."""


def depth(data: str | bytes) -> int:
    """How deep the arrays and objects of the JSON text ``data`` (UTF-8 if bytes) nest, 0 for a
    scalar: counted without recursion, in time linear in ``data``. Exact for valid JSON; for
    anything else a number that ``json.loads`` then refuses anyway."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    # Escaped backslashes, then escaped quotes, go first (left to right, as the escapes read:
    # in \\" the quote ends the string). No byte of a UTF-8 multi-byte character is ASCII, and
    # outside strings valid JSON has no backslash; what is left of a string is "...", whose
    # brackets are not structure.
    marks = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _DELETE)
    deepest = level = 0
    inside = False
    # In slices, so that no single call holds the GIL for long: the admission server reads a
    # large body in a thread beside its event loop.
    for at in range(0, len(marks), _SLICE):
        pieces = marks[at : at + _SLICE].split(b'"')
        # Every other piece between quotes is inside a string, counting on from the last slice.
        structure = b"".join(pieces[1::2] if inside else pieces[::2])
        inside ^= len(pieces) % 2 == 0
        steps = memoryview(structure.translate(_STEP)).cast("b")
        deepest = max(deepest, max(itertools.accumulate(steps, initial=level)))
        level += sum(steps)
    return deepest


def _plainly_utf8(data: bytes) -> bool:
    """What ``json.detect_encoding`` answers "utf-8" to without asking it, for the usual document
    (every admission review): a first byte that is ASCII but not NUL and a second that is not
    NUL. Its other answers need a BOM (whose first byte is past ASCII) or a NUL in the first two
    bytes; the call is a measurable share of a warm review (tests/contract/test_jsondoc.py checks
    the two agree)."""
    return len(data) > 0 and 0 < data[0] < 0x80 and data[1:2] != b"\x00"


def opening_brackets(data: str | bytes) -> int:
    """How many ``[`` and ``{`` the text ``data`` holds, strings included.

    For bytes, by deleting each (``bytes.replace``), which finds them with ``memchr``: bytes.count
    of one byte compares every byte in a loop of its own, and the two counts were 41,000
    instructions of a warm admission review (3.7 KB bodies, callgrind), against 15,000 so."""
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return 2 * len(data) - len(data.replace(b"[", b"")) - len(data.replace(b"{", b""))


def refuse_deep(data: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise ``TooDeep`` if the JSON text ``data`` nests deeper than ``max_depth``; bytes are read
    as ``json.loads`` reads them (UTF-8, -16 or -32)."""
    if isinstance(data, bytes) and not _plainly_utf8(data) and json.detect_encoding(data) != "utf-8":
        data = data.decode(json.detect_encoding(data), "surrogatepass")
    # With no more brackets than max_depth in all, nothing nests past it: a small document
    # pays two counts, not the scan.
    if opening_brackets(data) > max_depth:
        found = depth(data)
        if found > max_depth:
            raise TooDeep(f"JSON nested {found:,} levels deep, more than the {max_depth} allowed")


def loads(data: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(data)``, refusing nesting deeper than ``max_depth`` with ``TooDeep`` before
    parsing (``refuse_deep``)."""
    refuse_deep(data, max_depth=max_depth)
    return json.loads(data)


def dumps(doc: Mapping[str, Any]) -> str:
    """A document kernelbake writes, in its one canonical form (sorted keys, one space of
    indent, a final newline): equal documents are equal bytes, so a digest names one."""
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


# Made once: json.dumps with separators builds a JSONEncoder per call, a quarter of what
# encoding a warm admission answer costs (callgrind).
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def compact(value: Any) -> str:
    """``value`` as ``json.dumps(value, separators=(",", ":"))`` writes it: no spaces, for the wire."""
    return _COMPACT.encode(value)


T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of document kernelbake writes with ``dumps`` and reads back from outside (a
    delta.json, a capture record, a snapshot.json): how messages name it, the schemas it reads,
    its bound, and the error that says a text is not one."""

    what: str
    schemas: tuple[int, ...]
    max_bytes: int
    invalid: type[BadInput]

    def read(self, text: str | bytes, *, source: str, build: Callable[[dict[str, Any]], T]) -> T:
        """``build`` of the document in ``text``, once it is bounded, nested within bounds, an
        object and of a known schema; whatever it raises for a missing or malformed field, or
        any ``BadInput`` (a key's, an invariant's), is one ``invalid`` that names ``source``."""
        if len(text) > self.max_bytes:
            raise self.invalid(f"{source}: {len(text)} bytes, more than a {self.what} may hold")
        try:
            doc = loads(text)
            if not isinstance(doc, dict) or doc.get("schema") not in self.schemas:
                got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
                known = " or ".join(str(s) for s in sorted(self.schemas, reverse=True))
                raise self.invalid(f"{self.what} schema {got!r} is not {known}")
            return build(doc)
        except BadInput as exc:
            raise self.invalid(f"{source}: {exc}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise self.invalid(f"{source}: not a {self.what} ({type(exc).__name__}: {exc})") from None
