from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelbake.admission.references import (
    InvalidReference,
    loose_name,
    matches,
    normalise_pattern,
    parse_reference,
)
from kernelbake.errors import BadInput

D = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("text", "name", "tag", "digest"),
    [
        ("ubuntu", "docker.io/library/ubuntu", None, None),
        ("ubuntu:24.04", "docker.io/library/ubuntu", "24.04", None),
        ("index.docker.io/prom/statsd-exporter:v0.28.0", "docker.io/prom/statsd-exporter", "v0.28.0", None),
        ("127.0.0.1:5000/kb/qwen3:vllm0.26.0-cu130", "127.0.0.1:5000/kb/qwen3", "vllm0.26.0-cu130", None),
        (f"localhost/kb/qwen3@{D}", "localhost/kb/qwen3", None, D),
        (f"registry.example.com/a/b/c:t@{D}", "registry.example.com/a/b/c", "t", D),
        ("[::1]:5000/kb/x:1", "[::1]:5000/kb/x", "1", None),
    ],
)
def test_parses_what_container_runtimes_pull(
    text: str, name: str, tag: str | None, digest: str | None
) -> None:
    ref = parse_reference(text)
    assert (ref.name, ref.tag, ref.digest) == (name, tag, digest)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ubuntu",
        "Registry.Example.com:/x",
        "registry.example.com/Kernelbake/qwen",
        "registry.example.com/kb/qwen:",
        "registry.example.com/kb/qwen@sha256:abc",
        f"registry.example.com/kb/qwen@sha256:{'A' * 64}",
        "registry.example.com/kb//qwen",
        "registry.example.com/",
        "registry.example.com/kb/qwen:tag with space",
    ],
)
def test_rejects_what_is_not_a_reference(text: str) -> None:
    with pytest.raises(InvalidReference) as err:
        parse_reference(text)
    assert isinstance(err.value, BadInput)
    assert repr(text) in str(err.value)


def test_rewriting_keeps_the_written_name_and_tag() -> None:
    ref = parse_reference("ubuntu:24.04")
    assert ref.rewritten(D) == f"ubuntu@{D}"
    assert parse_reference(f"ubuntu@{D}").rewritten(D) == f"ubuntu@{D}"
    assert ref.name == "docker.io/library/ubuntu"


@pytest.mark.parametrize(
    ("name", "pattern", "expected"),
    [
        ("registry.example.com/kernelbake/qwen3", "registry.example.com/kernelbake/**", True),
        ("registry.example.com/kernelbake/a/b/c", "registry.example.com/kernelbake/**", True),
        ("registry.example.com/kernelbake", "registry.example.com/kernelbake/**", True),
        ("registry.example.com/other/qwen3", "registry.example.com/kernelbake/**", False),
        ("registry.example.com/kernelbake/a/b", "registry.example.com/kernelbake/*", False),
        ("registry.example.com/kernelbake/qwen3", "registry.example.com/kernelbake/qwen*", True),
        ("evil.example.com/kernelbake/qwen3", "registry.example.com/kernelbake/**", False),
        ("registry.example.com.evil.io/kernelbake/q", "registry.example.com/**", False),
        ("docker.io/library/ubuntu", normalise_pattern("ubuntu"), True),
        ("127.0.0.1:5000/kb/x", normalise_pattern("127.0.0.1:*/kb/**"), True),
    ],
)
def test_patterns_glob_per_path_segment(name: str, pattern: str, expected: bool) -> None:
    assert matches(name, pattern) is expected


def test_a_broken_reference_still_has_a_governable_name() -> None:
    assert loose_name("Registry.Example.com/KB/Qwen:tag") == "registry.example.com/kb/qwen"
    assert loose_name("@sha256:") is None


components = st.from_regex(r"[a-z0-9]{1,5}([._-][a-z0-9]{1,5}){0,2}", fullmatch=True)


@given(
    host=st.sampled_from(["registry.example.com", "127.0.0.1:5000", "localhost", "docker.io"]),
    path=st.lists(components, min_size=1, max_size=3),
    tag=st.none() | st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True),
    digest=st.none() | st.from_regex(r"sha256:[0-9a-f]{64}", fullmatch=True),
)
def test_canonical_form_round_trips(host: str, path: list[str], tag: str | None, digest: str | None) -> None:
    text = f"{host}/{'/'.join(path)}" + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
    ref = parse_reference(text)
    again = parse_reference(str(ref))
    assert (again.name, again.tag, again.digest) == (ref.name, ref.tag, ref.digest)
    assert str(again) == str(ref)
    assert (ref.tag, ref.digest) == (tag, digest)
