from __future__ import annotations

import fnmatch
import ipaddress
import time

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kernelbake.admission.references import (
    ImageRef,
    InvalidReference,
    matches,
    normalise_pattern,
    parse_reference,
)
from kernelbake.admission.rules.reference import _classify
from kernelbake.errors import BadInput

D = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("text", "name", "tag", "digest"),
    [
        ("ubuntu", "docker.io/library/ubuntu", None, None),
        ("ubuntu:24.04", "docker.io/library/ubuntu", "24.04", None),
        ("index.docker.io/prom/statsd-exporter:v0.28.0", "docker.io/prom/statsd-exporter", "v0.28.0", None),
        ("index.docker.io/ubuntu", "docker.io/library/ubuntu", None, None),
        ("registry.hub.docker.com/library/ubuntu:1", "docker.io/library/ubuntu", "1", None),
        ("Docker.IO/ubuntu:1", "docker.io/library/ubuntu", "1", None),
        ("127.0.0.1:5000/kb/qwen3:vllm0.26.0-cu130", "127.0.0.1:5000/kb/qwen3", "vllm0.26.0-cu130", None),
        (f"localhost/kb/qwen3@{D}", "localhost/kb/qwen3", None, D),
        (f"registry.example.com/a/b/c:t@{D}", "registry.example.com/a/b/c", "t", D),
        ("[::1]:5000/kb/x:1", "[::1]:5000/kb/x", "1", None),
        ("[0:0::1]:5000/kb/x:1", "[::1]:5000/kb/x", "1", None),
        # The spellings of one host that reach one server.
        ("LOCALHOST:5055/kernelbake/x:v1", "localhost:5055/kernelbake/x", "v1", None),
        ("LOCALHOST/kernelbake/x:v1", "localhost/kernelbake/x", "v1", None),
        ("localhost.:5055/kernelbake/x:v1", "localhost:5055/kernelbake/x", "v1", None),
        ("Registry.Example.COM./kb/x:1", "registry.example.com/kb/x", "1", None),
        ("registry.example.com:443/kb/x:1", "registry.example.com/kb/x", "1", None),
        ("registry.example.com:00443/kb/x:1", "registry.example.com/kb/x", "1", None),
        ("127.0.0.1:05000/kb/x:1", "127.0.0.1:5000/kb/x", "1", None),
        ("127.1:5000/kb/x:1", "127.0.0.1:5000/kb/x", "1", None),
        ("0x7f.0.0.1:5000/kb/x:1", "127.0.0.1:5000/kb/x", "1", None),
        ("0177.0.0.1:5000/kb/x:1", "127.0.0.1:5000/kb/x", "1", None),
        ("2130706433:5000/kb/x:1", "127.0.0.1:5000/kb/x", "1", None),
        ("[::ffff:7f00:1]:5000/kb/x:1", "127.0.0.1:5000/kb/x", "1", None),
        ("0:5000/kb/x:1", "0.0.0.0:5000/kb/x", "1", None),
        ("[0::0]:5000/kb/x:1", "[::]:5000/kb/x", "1", None),
        ("123abc.de/kb/x:1", "123abc.de/kb/x", "1", None),
        # Any digest algorithm parses (ungoverned images may use them).
        (f"ubuntu@sha512:{'b' * 128}", "docker.io/library/ubuntu", None, f"sha512:{'b' * 128}"),
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
        "registry.example.com:99999/kb/qwen:1",
        "registry.example.com:0/kb/qwen:1",
        "-registry.example.com/kb/qwen:1",
        "[::g]:5000/kb/x:1",
        "[::1/kb/x:1",
        "registry.example.com/kb/../qwen:1",
        "MyHost/kb/x:1",
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
    assert parse_reference("LOCALHOST:5055/kb/x:1").rewritten(D) == f"LOCALHOST:5055/kb/x@{D}"


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
        ("localhost:5055/kb/x", normalise_pattern("LOCALHOST:05055/kb/**"), True),
        ("registry.example.com/kb/x", normalise_pattern("Registry.Example.com.:443/kb/**"), True),
        ("127.0.0.1:5000/kb/x", normalise_pattern("127.1:5000/kb/**"), True),
        ("docker.io/library/ubuntu", normalise_pattern("index.docker.io/ubuntu"), True),
        ("a.example.com/kb/x", normalise_pattern("*.Example.com/kb/**"), True),
    ],
)
def test_patterns_glob_per_path_segment(name: str, pattern: str, expected: bool) -> None:
    assert matches(name, pattern) is expected


def test_patterns_with_uppercase_paths_or_bad_hosts_are_rejected() -> None:
    for bad in ("registry.example.com/KB/**", "registry.example.com:99999/kb/**"):
        with pytest.raises(InvalidReference, match="pattern"):
            normalise_pattern(bad)


# --- governance: what admission does with a reference, fail closed --------------------------

GOVERNED = tuple(
    normalise_pattern(p)
    for p in (
        "localhost:5055/kernelbake/**",
        "127.0.0.1:5000/kb/**",
        "registry.example.com/kb/**",
        "library/kb*",
    )
)


def classify(image: str, registries: tuple[str, ...] | None = None) -> ImageRef | str | None:
    return _classify(image, GOVERNED, registries)


def test_the_spelling_bypass_is_closed() -> None:
    """The attack: policy ``localhost:5055/kernelbake/**``, image ``LOCALHOST:5055/…`` was
    admitted untouched and Docker pulled it. It is governed (and so verified) now."""
    ref = classify("LOCALHOST:5055/kernelbake/x:v1")
    assert isinstance(ref, ImageRef) and ref.name == "localhost:5055/kernelbake/x"


@pytest.mark.parametrize(
    ("image", "alias"),
    [
        ("127.0.0.1:5055/kernelbake/x:v1", "localhost:5055/kernelbake/x"),
        ("[::1]:5055/kernelbake/x:v1", "localhost:5055/kernelbake/x"),
        ("127.0.0.2:5055/kernelbake/x:v1", "localhost:5055/kernelbake/x"),
        ("localhost:5000/kb/x:v1", "127.0.0.1:5000/kb/x"),
        ("registry.example.com:80/kb/x:1", "registry.example.com/kb/x"),
        # A connection to the unspecified address reaches the local host.
        ("0.0.0.0:5000/kb/x:v1", "127.0.0.1:5000/kb/x"),
        ("0:5000/kb/x:v1", "127.0.0.1:5000/kb/x"),
        ("[::]:5000/kb/x:v1", "127.0.0.1:5000/kb/x"),
        ("[::ffff:0:0]:5000/kb/x:v1", "127.0.0.1:5000/kb/x"),
        ("0.0.0.0:5055/kernelbake/x:v1", "localhost:5055/kernelbake/x"),
    ],
)
def test_another_server_spelling_that_may_be_governed_is_denied_naming_the_spelling(
    image: str, alias: str
) -> None:
    problem = classify(image)
    assert isinstance(problem, str)
    assert f"write it as {alias}" in problem


def test_a_governed_unspecified_address_governs_its_loopback_spellings() -> None:
    governed = (normalise_pattern("0.0.0.0:5101/kb/**"), normalise_pattern("[::1]:5102/kb/**"))
    for image, alias in [
        ("127.0.0.1:5101/kb/x:1", "0.0.0.0:5101/kb/x"),
        ("[::]:5101/kb/x:1", "0.0.0.0:5101/kb/x"),
        ("localhost:5102/kb/x:1", "[::1]:5102/kb/x"),
    ]:
        problem = _classify(image, governed, None)
        assert isinstance(problem, str) and f"write it as {alias}" in problem, (image, problem)
    # An IPv6 host in a pattern is matched as written, not read as a glob character class.
    for image in ("[::1]:5102/kb/x:1", "[0:0::1]:5102/kb/x:1"):
        ref = _classify(image, governed, None)
        assert isinstance(ref, ImageRef) and ref.name == "[::1]:5102/kb/x"


def test_an_ipv4_address_between_brackets_is_denied_naming_the_spelling_to_write() -> None:
    """The README said IPv4-mapped hosts become IPv4, and ``[::ffff:127.0.0.1]`` was denied as a
    "bad registry host". Both hold now, and say so: the hex form becomes IPv4, the dotted form
    is no reference a runtime pulls (the distribution grammar allows hex digits and colons
    between brackets) and the message names the IPv4 spelling."""
    with pytest.raises(InvalidReference) as err:
        parse_reference("[::ffff:127.0.0.1]:5000/kb/x:1")
    assert "container runtimes do not accept" in str(err.value)
    assert str(err.value).endswith("write 127.0.0.1:5000")
    problem = classify("[::ffff:127.0.0.1]:5000/kb/x:1")
    assert isinstance(problem, str) and "write 127.0.0.1:5000" in problem
    ref = classify("[::ffff:7f00:1]:5000/kb/x:1")
    assert isinstance(ref, ImageRef) and ref.name == "127.0.0.1:5000/kb/x"


@pytest.mark.parametrize("image", ["Not A Ref", "registry.example.com/KB/x:1", "x@sha256:", "::::"])
def test_what_cannot_be_canonicalised_is_denied_with_the_reason(image: str) -> None:
    problem = classify(image)
    assert isinstance(problem, str)
    assert "admits only references it can read" in problem


def test_a_governed_image_pinned_by_another_digest_algorithm_is_denied() -> None:
    problem = classify(f"registry.example.com/kb/x@sha512:{'b' * 128}")
    assert isinstance(problem, str) and "sha256 digests only" in problem
    assert classify(f"registry.example.com/other/x@sha512:{'b' * 128}") is None


@pytest.mark.parametrize(
    "image", ["nginx:1", "registry.example.com/other/x:1", "localhost:5056/kernelbake/x:1", "kb/x:1"]
)
def test_ungoverned_images_stay_ungoverned(image: str) -> None:
    assert classify(image) is None


LISTED = ("localhost:5055", "127.0.0.1:5000", "registry.example.com", "docker.io", "*.mirror.example.com")


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        # An /etc/hosts alias of 127.0.0.1: no name check can tell.
        ("vm:5000/kb/x:1", "vm:5000"),
        ("quay.io/acme/x:1", "quay.io"),
        ("localhost:5000/other/x:1", "localhost:5000"),
        ("mirror.example.com/x:1", "mirror.example.com"),
    ],
)
def test_unlisted_registries_deny_names_the_registry(image: str, registry: str) -> None:
    problem = classify(image, LISTED)
    assert isinstance(problem, str)
    assert f"is from the registry {registry}, which the policy does not list" in problem
    assert "unverified_registries" in problem
    assert classify(image) is None


@pytest.mark.parametrize(
    "image",
    ["nginx:1", "registry.example.com/other/x:1", "127.0.0.1:5000/other/x:1", "a.mirror.example.com/x:1"],
)
def test_listed_registries_pass_their_ungoverned_images(image: str) -> None:
    assert classify(image, LISTED) is None


def test_governed_images_and_aliases_are_decided_before_the_registry_list() -> None:
    ref = classify("registry.example.com/kb/x:1", ())
    assert isinstance(ref, ImageRef)
    problem = classify("localhost:5000/kb/x:1", ())
    assert isinstance(problem, str) and "write it as 127.0.0.1:5000/kb/x" in problem


# --- properties over the distribution reference grammar -------------------------------------
# The grammar (github.com/distribution/reference, reference.go), written out as strategies.

_alnum = st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
domain_component = st.from_regex(r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,8}[a-zA-Z0-9])?", fullmatch=True)
ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
ipv6 = st.ip_addresses(v=6).map(lambda a: f"[{a.exploded if a.is_private else a.compressed}]")
domain_name = st.lists(domain_component, min_size=1, max_size=4).map(".".join)
port = st.integers(1, 65535).map(str)
domain = st.tuples(st.one_of(domain_name, ipv4, ipv6), st.none() | port).map(
    lambda t: t[0] if t[1] is None else f"{t[0]}:{t[1]}"
)
path_component = st.from_regex(r"[a-z0-9]{1,4}(([._]|__|-{1,3})[a-z0-9]{1,4}){0,2}", fullmatch=True)
path = st.lists(path_component, min_size=1, max_size=4).map("/".join)
tag = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,30}", fullmatch=True)
digest = st.from_regex(r"sha256:[0-9a-f]{64}", fullmatch=True)


@st.composite
def grammar_references(draw: st.DrawFn) -> str:
    name = draw(path)
    if draw(st.booleans()):
        name = f"{draw(domain)}/{name}"
    elif "." in name.partition("/")[0]:
        # Without a domain, a first component with a dot would be read as one (the runtime's
        # rule): that is another reference than the one drawn.
        name = f"library/{name}"
    if draw(st.booleans()):
        name += f":{draw(tag)}"
    if draw(st.booleans()):
        name += f"@{draw(digest)}"
    return name


@given(grammar_references())
@example("LOCALHOST:5055/kernelbake/x:v1")
@example("A/0")
def test_every_reference_of_the_grammar_parses_and_its_canonical_form_is_a_fixpoint(text: str) -> None:
    first = text.partition("/")[0]
    if first != first.lower() and not any(c in first for c in ".:") and first.lower() != "localhost":
        # ``MyHost/x``: a registry only by its capital letter, no canonical spelling; refused.
        with pytest.raises(InvalidReference, match="no canonical spelling"):
            parse_reference(text)
        return
    ref = parse_reference(text)
    again = parse_reference(str(ref))
    assert (again.name, again.tag, again.digest) == (ref.name, ref.tag, ref.digest)
    assert str(again) == str(ref)
    assert ref.name == ref.name.lower()


def _case(draw: st.DrawFn, text: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return "".join(c.upper() if f else c for c, f in zip(text, flips, strict=True))


_IPV4_SPELLINGS = ("127.0.0.1", "127.1", "127.0.1", "0x7f.0.0.1", "0x7F000001", "2130706433", "0177.0.0.01")


@st.composite
def spellings_of_governed(draw: st.DrawFn) -> tuple[str, str]:
    """(a spelling, the canonical name it must be governed as)."""
    which = draw(st.sampled_from(["localhost", "ipv4", "dns", "hub"]))
    repo = draw(path)
    if which == "localhost":
        host, canonical = _case(draw, "localhost") + draw(st.sampled_from(["", "."])), "localhost:5055"
        host += ":" + draw(st.sampled_from(["5055", "05055", "005055"]))
        repo, canonical = f"kernelbake/{repo}", f"{canonical}/kernelbake/{repo}"
    elif which == "ipv4":
        host = draw(st.sampled_from(_IPV4_SPELLINGS)) + ":" + draw(st.sampled_from(["5000", "05000"]))
        repo, canonical = f"kb/{repo}", f"127.0.0.1:5000/kb/{repo}"
    elif which == "dns":
        host = _case(draw, "registry.example.com") + draw(st.sampled_from(["", "."]))
        host += draw(st.sampled_from(["", ":443", ":0443"]))
        repo, canonical = f"kb/{repo}", f"registry.example.com/kb/{repo}"
    else:
        host = draw(st.sampled_from(["", "docker.io/", "index.docker.io/", "registry-1.docker.io/"]))
        host += draw(st.sampled_from(["", "library/"]))
        head = "kb" + draw(path_component)
        return f"{host}{head}:1", f"docker.io/library/{head}"
    return f"{host}/{repo}:{draw(tag)}", canonical


@given(spellings_of_governed())
def test_every_spelling_of_a_governed_repository_is_governed_under_its_canonical_name(
    case: tuple[str, str],
) -> None:
    spelling, canonical = case
    ref = classify(spelling)
    assert isinstance(ref, ImageRef), (spelling, ref)
    assert ref.name == canonical


def _loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host == "localhost"
    return address.is_loopback or address.is_unspecified


@given(st.one_of(st.text(max_size=60), grammar_references(), spellings_of_governed().map(lambda c: c[0])))
@example("127.0.0.1:5055/kernelbake/x:1")
def test_nothing_that_could_be_governed_is_waved_through(text: str) -> None:
    """Fail closed: admission lets a reference pass untouched only when it parses, its canonical
    name is not governed, and no loopback spelling of its server is governed either."""
    if classify(text) is not None:
        return
    ref = parse_reference(text)
    assert not any(matches(ref.name, p) for p in GOVERNED), text
    host, _, port = (
        ref.domain.rpartition(":")
        if ref.domain.count(":") == 1 or "]:" in ref.domain
        else (
            ref.domain,
            "",
            "",
        )
    )
    if _loopback(host):
        for other in ("localhost", "127.0.0.1", "[::1]", "0.0.0.0", "[::]"):
            name = f"{other}:{port}/{ref.path}" if port else f"{other}/{ref.path}"
            assert not any(matches(name, p) for p in GOVERNED), (text, name)


def _recursive_match(name: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    """The glob's definition, spelled as the obvious (exponential) recursion."""
    if not pattern:
        return not name
    head, tail = pattern[0], pattern[1:]
    if head == "**":
        return any(_recursive_match(name[i:], tail) for i in range(len(name) + 1))
    return (
        bool(name)
        and (head == name[0] or fnmatch.fnmatchcase(name[0], head))
        and _recursive_match(name[1:], tail)
    )


segments = st.sampled_from(["a", "b", "ab", ""])
pattern_segments = st.sampled_from(["a", "b", "*", "a*", "**", "?"])


@given(st.lists(segments, max_size=6), st.lists(pattern_segments, min_size=1, max_size=6))
def test_the_segment_glob_agrees_with_its_definition(name: list[str], pattern: list[str]) -> None:
    n, p = "/".join(name), "/".join(pattern)
    assert matches(n, p) is _recursive_match(tuple(n.split("/")), tuple(p.split("/")))


def test_many_double_stars_against_a_long_name_take_polynomial_time() -> None:
    # The name is the pod author's: with the recursive definition, ten ``**`` against 128
    # segments is about 128^10 steps.
    name = "/".join(["a"] * 127) + "/z"
    pattern = "/".join(["**"] * 10) + "/b"
    started = time.perf_counter()
    assert not matches(name, pattern)
    assert time.perf_counter() - started < 1.0
