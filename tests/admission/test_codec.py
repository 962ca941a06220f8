"""The webhook reads a body as ``json.loads`` reads it (``http.codec.decode``, jiter with json
behind it): the same document, of the same types in the same order, and refused exactly when
json refuses it, for generated JSON texts (repeated keys, odd spacing, escapes, surrogates,
numbers of every shape) and for broken ones."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kernelbake.admission.http import codec
from tests.admission import documents

# Strings: escapes, quotes, controls, non-ASCII and surrogates (lone ones included).
_TEXT = st.text(alphabet=st.characters(blacklist_categories=()), max_size=8) | st.sampled_from(
    ["", "\\", '"', "\x00", "\x1f", "\x7f", "\u2028", "\ud800", "\udfff", "\U0001f600", "é"]
)
_NUMBERS = (
    st.sampled_from(
        [
            "0",
            "-0",
            "-0.0",
            "1e400",
            "-1e400",
            "1E+2",
            "2.5e-3",
            "0.1e-400",
            "NaN",
            "Infinity",
            "-Infinity",
            "9007199254740993",
            "9007199254740993.0",
            "1" * 40,
            "-" + "9" * 4300,
            "1" * 4301,
            "1.0000000000000001",
            "2.2250738585072011e-308",
            "4.9e-324",
            "123456789012345678901234567890.5",
        ]
    )
    | st.integers().map(str)
    | st.floats(allow_nan=False, allow_infinity=False).map(repr)
)
_SPACE = st.sampled_from(["", " ", "\n", "\t", "\r\n  "])


@st.composite
def _json_text(draw: st.DrawFn, depth: int = 0) -> str:
    """A JSON text, objects with keys repeated at will, spaced at random."""
    kind = draw(st.sampled_from(["scalar", "scalar", "array", "object"] if depth < 4 else ["scalar"]))
    space = draw(_SPACE)
    if kind == "array":
        items = draw(st.lists(_json_text(depth + 1), max_size=4))
        return f"[{space}{(',' + space).join(items)}]"
    if kind == "object":
        keys = draw(st.lists(_TEXT, max_size=4))
        keys += draw(st.lists(st.sampled_from(keys), max_size=2)) if keys else []
        pairs = [f"{_string(draw, k)}{space}:{draw(_json_text(depth + 1))}" for k in keys]
        return "{" + space + ",".join(pairs) + "}"
    return draw(
        st.one_of(
            _NUMBERS,
            st.sampled_from(["true", "false", "null"]),
            _TEXT.map(lambda t: _string(draw, t)),
        )
    )


def _string(draw: st.DrawFn, text: str) -> str:
    return json.dumps(text, ensure_ascii=draw(st.booleans()))


def _same(a: Any, b: Any) -> bool:
    """Equal, of the same types all the way down, dicts in the same order, floats bit for bit
    (-0.0, NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _read(body: bytes) -> tuple[str, Any]:
    try:
        return "read", codec.decode(body)
    except ValueError as exc:
        return "refused", type(exc)


def _reference(body: bytes) -> tuple[str, Any]:
    try:
        return "read", json.loads(body)
    except ValueError as exc:
        return "refused", type(exc)


def _agree(body: bytes) -> None:
    got, want = _read(body), _reference(body)
    assert got[0] == want[0] and (got[1] is want[1] if got[0] == "refused" else _same(got[1], want[1])), (
        body[:200],
        got,
        want,
    )


@settings(max_examples=400)
@given(_json_text(), st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32-be"]))
def test_a_body_is_read_as_json_reads_it(text: str, encoding: str) -> None:
    _agree(text.encode(encoding, "surrogatepass"))


@settings(max_examples=400)
@given(_json_text(), st.data())
def test_a_broken_body_is_refused_as_json_refuses_it(text: str, data: st.DataObject) -> None:
    body = bytearray(text.encode("utf-8", "surrogatepass"))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(body)))
        change = data.draw(st.sampled_from(["delete", "insert", "truncate"]))
        if change == "delete" and at < len(body):
            del body[at]
        elif change == "insert":
            body[at:at] = data.draw(
                st.sampled_from(
                    [b",", b"]", b"}", b'"', b"\\", b"\x00", b"\xff", b"\xed", b" ", b"e", b"-", b"\xc3"]
                )
            )
        else:
            del body[at:]
    _agree(bytes(body))


def test_the_reviews_the_load_mix_sends_are_read_as_json_reads_them() -> None:
    for name in ("pod-create", "deployment-create"):
        doc = documents.load(name, "registry.example.com/kernelbake/qwen3-0.6b:h100")
        for body in (json.dumps(doc).encode(), json.dumps(doc, indent=1, ensure_ascii=False).encode()):
            _agree(body)
            assert codec.decode(body) == doc
