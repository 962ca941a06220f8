"""Image references parse into one value type and print back; only loopback gets plain HTTP."""

from __future__ import annotations

import contextlib
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelbake.errors import BadInput
from kernelbake.oci import InvalidReference, Reference, base_url, parse_reference
from kernelbake.oci.client import fallback_tag
from kernelbake.oci.reference import NAME_MAX, is_host_syntax

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


# Reference parsing runs inside the admission webhook on text any pod author chooses: it must
# take time linear in the input. The regular expression this replaced backtracked
# exponentially on a run of letters that ends in a character no host may hold (issue 20: 25
# letters cost 5.5 s, every further one doubled it). The bounds below are generous ceilings
# for a loaded 2-core machine; the exponential pattern needed seconds at 25 characters.
ADVERSARIAL = [
    *("A" * n + "_/x:1" for n in (25, 27, 40, 64, 250, 255, 300, 4090)),
    *("a" * n + "-/x" for n in (30, 250, 4090)),
    "a." * 126 + "-/x",
    "a" + "-a" * 2000 + "!/x",
    "example.com/" + "a" * 4000 + "!",
    "example.com/" + "a-" * 2000 + "!",
    "example.com/" + "a." * 2000,
    "example.com/" + "a_" * 2000 + "_",
    "[" + "f:" * 2000 + "]/x",
    "example.com:" + "9" * 4000 + "/x",
    "example.com/x:" + "a" * 4000,
    "example.com/x@sha256:" + "a" * 4000,
]


@pytest.mark.parametrize("text", ADVERSARIAL, ids=lambda t: f"{t[:12]}…{len(t)}")
def test_adversarial_references_are_refused_in_linear_time(text: str) -> None:
    started = time.perf_counter()
    with pytest.raises(InvalidReference):
        parse_reference(text)
    assert time.perf_counter() - started < 0.05


reference_chars = st.sampled_from("aA0_-.:/@[]sha256bcdef" + "x" * 4)


@settings(max_examples=300, deadline=None)
@given(st.text(reference_chars, max_size=4096) | st.text(max_size=4096))
def test_any_text_up_to_4_kib_parses_or_is_refused_fast(text: str) -> None:
    started = time.perf_counter()
    with contextlib.suppress(InvalidReference):
        parse_reference(text)
    assert time.perf_counter() - started < 0.05


def test_names_longer_than_the_grammar_allows_are_refused() -> None:
    longest = "example.com/" + "a" * (NAME_MAX - len("example.com/"))
    assert parse_reference(longest + ":t").repository == "a" * (NAME_MAX - len("example.com/"))
    with pytest.raises(InvalidReference, match="longer than 255"):
        parse_reference(longest + "a:t")
    with pytest.raises(InvalidReference, match="at most"):
        parse_reference("example.com/x:" + "t" * 1000)


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("example.com", True),
        ("example.com.", True),
        ("a-b.c:5000", True),
        ("[::1]:5000", True),
        ("[::ffff:7f00:1]", True),
        ("[::ffff:127.0.0.1]", False),
        ("example..com", False),
        ("-a.com", False),
        ("a-.com", False),
        ("a.com:", False),
        ("a.com:5x", False),
        ("a.com:00005000", True),
        ("[::1]x", False),
        ("[]", False),
        ("a_b.com", False),
    ],
)
def test_host_syntax(host: str, ok: bool) -> None:
    assert is_host_syntax(host) is ok
