"""The one YAML validation helper: every message is ``file:line: field: message``."""

from __future__ import annotations

import enum
from pathlib import Path

import pytest

from kernelbake.errors import BadInput, SpecError
from kernelbake.validate import MAX_QUOTED, MAX_YAML_EXPANDED, Source, load_yaml, quoted

DOC = """\
name: x
serve:
  dtype: bf16
identities:
  - issuer: a
  - issuer: b
    subject: c
"""


class Colour(enum.Enum):
    NONE = "none"
    RED = "red"
    DARK_BLUE = "dark-blue"


def _load(tmp_path: Path, text: str = DOC) -> tuple[object, Source]:
    path = tmp_path / "f.yaml"
    path.write_text(text)
    return load_yaml(path, what="spec", error_type=SpecError)


def test_lines_follow_keys_and_list_indices(tmp_path: Path) -> None:
    _, src = _load(tmp_path)
    assert src.line("") == 1
    assert src.line("serve.dtype") == 3
    assert src.line("identities[1]") == 6
    assert src.line("identities[1].subject") == 7
    # Absent parts: the closest ancestor that is there.
    assert src.line("serve.missing") == 2
    assert src.line("identities[9]") == 4
    err = src.error("identities[1].subject", "bad")
    assert isinstance(err, SpecError) and str(err) == f"{tmp_path}/f.yaml:7: identities[1].subject: bad"


def test_a_child_names_paths_under_its_prefix(tmp_path: Path) -> None:
    _, src = _load(tmp_path)
    child = src.child("identities").child("[0]")
    assert child.where("issuer") == f"{tmp_path}/f.yaml:5: identities[0].issuer"
    assert child.with_error(BadInput).error("", "x").__class__ is BadInput


def test_a_source_without_a_file_has_no_line() -> None:
    src = Source("admission.yaml: verify")
    assert src.where("keys[0]") == "admission.yaml: verify: keys[0]"
    assert src.where() == "admission.yaml: verify"


def test_mapping_checks_type_unknown_and_required_keys(tmp_path: Path) -> None:
    data, src = _load(tmp_path)
    assert isinstance(data, dict)
    with pytest.raises(SpecError, match=r"f.yaml:2: serve.dtyp: unknown key; did you mean 'dtype'\?"):
        src.mapping({"dtyp": 1}, "serve", {"dtype"})
    with pytest.raises(SpecError, match=r"f.yaml:2: serve: missing required key serve.dtype"):
        src.mapping({}, "serve", {"dtype"}, {"dtype"})
    with pytest.raises(SpecError, match=r"f.yaml:1: name: expected a mapping, got str"):
        src.mapping(data["name"], "name", ())


def test_enum_takes_wire_values_aliases_and_null(tmp_path: Path) -> None:
    _, src = _load(tmp_path)
    assert src.enum(Colour, "red", "c") is Colour.RED
    assert src.enum(Colour, None, "c") is Colour.NONE
    assert src.enum(Colour, "navy", "c", aliases={"navy": "dark-blue"}) is Colour.DARK_BLUE
    assert src.enum(Colour, "RED", "c", fold_case=True) is Colour.RED
    with pytest.raises(SpecError, match=r"c: unknown value 'RED'; expected one of"):
        src.enum(Colour, "RED", "c")  # exact unless the caller folds case
    with pytest.raises(SpecError, match=r"c: unknown value 'rde'; did you mean 'red'\?"):
        src.enum(Colour, "rde", "c")
    with pytest.raises(SpecError, match=r"c: unknown value 'green'; expected one of: dark-blue, none, red"):
        src.enum(Colour, "green", "c")


def test_typed_getters(tmp_path: Path) -> None:
    _, src = _load(tmp_path)
    assert src.positive_int(3, "n") == 3
    for bad in (0, -1, True, "3", 1.5):
        with pytest.raises(SpecError, match="expected a positive integer"):
            src.positive_int(bad, "n")
    assert src.seconds(0, "s") == 0.0 and src.seconds(2.5, "s") == 2.5
    for bad in (-1, False, "soon"):
        with pytest.raises(SpecError, match="expected a non-negative number of seconds"):
            src.seconds(bad, "s")
    assert src.boolean(True, "b") is True and src.boolean(False, "b") is False
    for bad in (1, 0, "yes", None):
        with pytest.raises(SpecError, match="b: expected true or false"):
            src.boolean(bad, "b")
    assert src.optional_list(None, "l") == [] and src.optional_list([1], "l") == [1]
    with pytest.raises(SpecError, match="l: expected a list, got str"):
        src.optional_list("x", "l")


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"nope.yaml: cannot read spec: No such file"):
        load_yaml(tmp_path / "nope.yaml", what="spec", error_type=SpecError)
    (tmp_path / "latin.yaml").write_bytes(b"name: caf\xe9\n")
    with pytest.raises(SpecError, match=r"latin.yaml: spec is not UTF-8 text \(byte 0xe9 at offset 9\)"):
        load_yaml(tmp_path / "latin.yaml", what="spec", error_type=SpecError)
    with pytest.raises(SpecError, match=r"f.yaml:2: malformed YAML: "):
        _load(tmp_path, "a: [1,\nb: }\n")
    data, src = _load(tmp_path, "")
    assert data is None and src.line("x") is None


@pytest.mark.parametrize(
    ("text", "field", "lines"),
    [
        ("name: x\nserve: {}\nname: y\n", "name", (3, 1)),
        # At depth: a mapping in a list in a mapping in a mapping.
        ("a:\n  b:\n    - c:\n        d: 1\n        e: 2\n        d: 3\n", "a.b[0].c.d", (6, 4)),
        ("a: [{x: 1, x: 2}]\n", "a[0].x", (1, 1)),
        # One key however it is spelled: quoted and plain, YAML 1.1's yes and true.
        ("serve:\n  dtype: a\n  'dtype': b\n", "serve.dtype", (3, 2)),
        ("flags:\n  yes: 1\n  true: 2\n", "flags.true", (3, 2)),
    ],
)
def test_a_key_given_twice_is_refused_naming_both_lines(
    tmp_path: Path, text: str, field: str, lines: tuple[int, int]
) -> None:
    path = tmp_path / "f.yaml"
    again, first = lines
    with pytest.raises(SpecError) as info:
        _load(tmp_path, text)
    assert info.value.message.startswith(f"{path}:{again}: {field}: duplicate key ")
    assert info.value.message.endswith(f", first at {path}:{first}")
    assert info.value.return_code == 2 and info.value.hint and "keep one" in info.value.hint


def test_a_merged_key_may_be_overridden(tmp_path: Path) -> None:
    data, _ = _load(tmp_path, "base: &b {dtype: a, tp: 1}\nserve:\n  <<: *b\n  dtype: b\n")
    assert data == {"base": {"dtype": "a", "tp": 1}, "serve": {"dtype": "b", "tp": 1}}


def test_aliases_are_weighed_as_they_expand(tmp_path: Path) -> None:
    # 4 scalars of 1,000 characters, aliased: each alias weighs its anchor's whole value again.
    item = "x" * 999
    within = MAX_YAML_EXPANDED // 1000 // 4 - 2
    text = f"a: &a [{item}, {item}, {item}, {item}]\nb: [" + ", ".join(["*a"] * within) + "]\n"
    data, _ = _load(tmp_path, text)
    assert isinstance(data, dict) and len(data["b"]) == within
    with pytest.raises(
        SpecError, match=r"f.yaml:2: YAML refused: aliases expand the document past 1,048,576"
    ):
        _load(tmp_path, text.replace("*a]", "*a, *a, *a, *a]"))


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"f.yaml:2: YAML refused: alias \*r is inside its own anchor"):
        _load(tmp_path, "a: &r\n  - *r\n")


def test_quoted_values_are_cut_whatever_their_size() -> None:
    assert quoted("red") == "'red'" and quoted(8) == "8" and quoted([1, "a"]) == "[1, 'a']"
    assert quoted("x" * 100_000) == "'" + "x" * 80 + "...' (100,000 characters)"
    assert quoted("y" * 100, chars=512) == repr("y" * 100)
    assert len(quoted([["x" * 1000] * 4] * 4)) == MAX_QUOTED
    nested: list[object] = ["lol"] * 9
    for _ in range(8):
        nested = [nested] * 9  # 9^9 strings, shared as a YAML alias shares them
    assert len(quoted(nested)) <= MAX_QUOTED


def test_a_validator_quotes_a_bounded_part_of_what_it_refuses(tmp_path: Path) -> None:
    _, src = _load(tmp_path)
    with pytest.raises(SpecError) as info:
        src.positive_int("9" * 200_000, "serve.max_num_seqs")
    assert info.value.message.startswith(
        f"{tmp_path}/f.yaml:2: serve.max_num_seqs: expected a positive integer, got '9999"
    )
    assert len(info.value.message) < 300
