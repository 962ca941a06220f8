"""Bounded JSON parsing (``kernelbake.contract.jsondoc``): the depth is counted exactly, without
recursion, strings and their escapes included, and a document past the bound is refused
before ``json`` recurses into it."""

from __future__ import annotations

import codecs
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelbake.contract import jsondoc
from kernelbake.contract.jsondoc import MAX_JSON_DEPTH, TooDeep

# Strings full of what the counter must not take for structure.
_TEXT = st.text(alphabet=st.sampled_from('[]{}"\\/ab\n\t\u00e9\u225b\U0001f600'), max_size=12)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=40,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@given(_VALUES, st.booleans())
def test_the_depth_is_that_of_the_value_whatever_its_strings_hold(value: Any, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert jsondoc.depth(text) == jsondoc.depth(text.encode()) == _depth(value)
    assert jsondoc.loads(text) == jsondoc.loads(text.encode("utf-16")) == value


@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode), st.booleans())
def test_opening_brackets_are_counted_as_count_counts_them(data: bytes, as_text: bool) -> None:
    text: str | bytes = data.decode("utf-8", "replace") if as_text else data
    want = text.count("[") + text.count("{") if isinstance(text, str) else data.count(b"[") + data.count(b"{")
    assert jsondoc.opening_brackets(text) == want


def test_the_bound_is_exact_and_refused_before_json_recurses() -> None:
    at = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert jsondoc.loads(at) is not None
    with pytest.raises(TooDeep, match=f"JSON nested {MAX_JSON_DEPTH + 1} levels deep, more than the 128"):
        jsondoc.loads("[" + at + "]")
    # 200,000 deep: json itself ends in a RecursionError, the bound in a ValueError.
    deep = '{"a":' * 200_000 + "1" + "}" * 200_000
    with pytest.raises(RecursionError):
        json.loads(deep)
    with pytest.raises(ValueError, match="JSON nested 200,000 levels deep"):
        jsondoc.loads(deep.encode())


def test_brackets_inside_strings_are_not_structure() -> None:
    text = json.dumps(["[" * 1000, {"k": '\\"{{{{' * 300}])
    assert jsondoc.depth(text) == 2 and jsondoc.loads(text)[0] == "[" * 1000
    # Counted across the slices the scan works in.
    wide = json.dumps(["x" * (3 << 16) + "[" * 500, [[[]]]])
    assert jsondoc.depth(wide) == 4


def test_malformed_json_is_still_malformed() -> None:
    for bad in ('["unterminated', "[" * 200 + '"', "{]"):
        with pytest.raises(ValueError):
            jsondoc.loads(bad)


class _Invalid(jsondoc.BadInput, ValueError):
    pass


_KIND = jsondoc.Kind("test document", (1, 2), 1 << 10, _Invalid)


def test_a_kind_reads_its_schemas_and_names_the_source_in_every_refusal() -> None:
    assert _KIND.read(jsondoc.dumps({"schema": 1, "n": 3}), source="t.json", build=lambda d: d["n"]) == 3
    refusals = [
        ("x" * 2000, r"^t\.json: 2000 bytes, more than a test document may hold$"),
        ('{"schema": 3}', r"^t\.json: test document schema 3 is not 2 or 1$"),
        ("[1]", r"^t\.json: test document schema 'list' is not 2 or 1$"),
        ("[" * 200 + "]" * 200, r"^t\.json: not a test document \(TooDeep: JSON nested 200 levels deep"),
        ('{"schema": 2}', r"^t\.json: not a test document \(KeyError: 'n'\)$"),
    ]
    for text, why in refusals:
        with pytest.raises(_Invalid, match=why):
            _KIND.read(text, source="t.json", build=lambda d: d["n"])

    def invariant(doc: dict[str, Any]) -> None:
        raise jsondoc.BadInput("n must be odd")

    with pytest.raises(_Invalid, match=r"^t\.json: n must be odd$"):
        _KIND.read('{"schema": 2, "n": 2}', source="t.json", build=invariant)


@given(_VALUES | st.floats(allow_nan=True))
def test_compact_writes_what_json_dumps_writes_without_spaces(value: Any) -> None:
    # The admission answer and its JSONPatch are written so, by one encoder made once.
    assert jsondoc.compact(value) == json.dumps(value, separators=(",", ":"))


def test_dumps_is_one_form_for_equal_documents() -> None:
    assert jsondoc.dumps({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == jsondoc.dumps(
        {"a": [1, {"c": 3, "d": 2}], "b": 1}
    )
    assert jsondoc.dumps({"a": 1}) == '{\n "a": 1\n}\n'


@given(st.binary(max_size=6) | st.sampled_from([codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF32_BE]))
def test_the_utf8_shortcut_answers_as_json_does(head: bytes) -> None:
    for data in (head, head + b'{"a": [1]}', b"{" + head, b"[" + head):
        if jsondoc._plainly_utf8(data):
            assert json.detect_encoding(data) == "utf-8", data


def test_the_utf8_shortcut_leaves_other_encodings_to_json() -> None:
    for encoding in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-8-sig"):
        data = '{"a": [1]}'.encode(encoding)
        assert not jsondoc._plainly_utf8(data), encoding
    deep = ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)).encode("utf-16-le")
    with pytest.raises(TooDeep):
        jsondoc.refuse_deep(deep)
