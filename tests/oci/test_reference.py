"""Image references parse into one value type and print back; only loopback gets plain HTTP."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelbake.errors import BadInput
from kernelbake.oci import InvalidReference, Reference, base_url, parse_reference
from kernelbake.oci.client import fallback_tag

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("127.0.0.1:5000/kb/tiny:v1", "127.0.0.1:5000", "kb/tiny", "v1", None),
        (f"127.0.0.1:5000/kb/tiny@{DIGEST}", "127.0.0.1:5000", "kb/tiny", None, DIGEST),
        (f"ghcr.io/acme/img:v1@{DIGEST}", "ghcr.io", "acme/img", "v1", DIGEST),
        ("localhost/x", "localhost", "x", "latest", None),
        ("nginx", "docker.io", "library/nginx", "latest", None),
        ("acme/nginx:1.2", "docker.io", "acme/nginx", "1.2", None),
        ("[::1]:5000/a/b:c", "[::1]:5000", "a/b", "c", None),
    ],
)
def test_parse(text: str, registry: str, repository: str, tag: str | None, digest: str | None) -> None:
    ref = parse_reference(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repository, tag, digest)
    assert parse_reference(str(ref)) == ref


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("127.0.0.1:5000/Kb/tiny:v1", "bad repository"),
        ("127.0.0.1:5000/kb/tiny@sha256:abc", "digest"),
        ("127.0.0.1:5000/kb/tiny@md5:" + "a" * 32, "digest"),
        ("127.0.0.1:5000/kb/tiny:-bad", "bad tag"),
        ("127.0.0.1:5000/", "bad repository"),
    ],
)
def test_invalid_references_quote_the_input(text: str, match: str) -> None:
    with pytest.raises(InvalidReference, match=match) as exc:
        parse_reference(text)
    assert repr(text) in str(exc.value)


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("127.0.0.1:5000/kb/tiny:t1", Reference("127.0.0.1:5000", "kb/tiny", "t1")),
        (
            "ghcr.io/acme/models/qwen3-8b@sha256:" + "a" * 64,
            Reference("ghcr.io", "acme/models/qwen3-8b", None, "sha256:" + "a" * 64),
        ),
        # No tag and no digest is ``latest``, spelled out in the value.
        ("localhost:5000/x", Reference("localhost:5000", "x", "latest")),
        ("vllm/vllm-openai:v0.26.0", Reference("docker.io", "vllm/vllm-openai", "v0.26.0")),
        ("ubuntu", Reference("docker.io", "library/ubuntu", "latest")),
    ],
)
def test_parse_reference(text: str, ref: Reference) -> None:
    assert parse_reference(text) == ref


@pytest.mark.parametrize("text", ["127.0.0.1:5000/Kb/x:t", "r.io/x@sha256:abc", "r.io/"])
def test_bad_reference(text: str) -> None:
    with pytest.raises(BadInput):
        parse_reference(text)


def test_plain_http_only_for_loopback() -> None:
    assert base_url("127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert base_url("localhost:5000") == "http://localhost:5000"
    assert base_url("ghcr.io") == "https://ghcr.io"
    assert base_url("127.0.0.1.evil.example") == "https://127.0.0.1.evil.example"
    assert base_url("[::1]:5000") == "http://[::1]:5000"
    assert base_url("registry.internal:5000", {"registry.internal:5000"}) == "http://registry.internal:5000"


def test_fallback_tag_scheme() -> None:
    assert fallback_tag(DIGEST) == "sha256-" + "ab" * 32


component = st.from_regex(r"[a-z0-9]{1,8}(?:[._-][a-z0-9]{1,8})?", fullmatch=True)
tags = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
digests = st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex())


@given(st.lists(component, min_size=1, max_size=3), st.none() | tags, st.none() | digests)
def test_round_trip(path: list[str], tag: str | None, digest: str | None) -> None:
    text = (
        "registry.example:5000/"
        + "/".join(path)
        + (f":{tag}" if tag else "")
        + (f"@{digest}" if digest else "")
    )
    ref = parse_reference(text)
    assert ref.digest == digest
    assert ref.tag == (tag if tag or digest else "latest")
    assert parse_reference(str(ref)) == ref
