"""Image references as admission needs them, on top of ``kernelbake.oci``'s parser.

Governance is decided on the canonical name the container runtime would pull
(``kernelbake.oci.hosts``: host case-folded, trailing dot dropped, IPv4 forms and the default
port normalised, Docker Hub's aliases, ``library/`` for one-component Hub names), so no other
spelling of a governed repository's host gets past the policy. Beyond the name, admission
needs whether a tag was *written* (the registry reads a bare name as ``:latest``, admission
denies it), and the name exactly as written, so a rewritten reference changes only what must
change.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Sequence

from kernelbake import oci
from kernelbake.oci import InvalidReference
from kernelbake.oci.hosts import DOCKER_HUB, InvalidHost, aliases, canonical_host, canonical_host_pattern
from kernelbake.oci.reference import is_digest, split_registry
from kernelbake.validate import quoted

__all__ = ["ImageRef", "InvalidReference", "alias_names", "matches", "normalise_pattern", "parse_reference"]

# Digests of other algorithms (OCI image spec: sha512 is 128 lowercase hex digits). kernelbake
# verifies sha256 only; the parse accepts sha512 so that ungoverned images pinned that way pass
# untouched, and admission denies governed ones.
_OTHER_DIGEST = re.compile(r"sha512:[0-9a-f]{128}")

# A reference (or host) is quoted whole up to this length, more than any real one holds
# (a 255-character name, a 128-character tag, a digest): a longer one is cut in messages.
QUOTED_CHARS = 512


def _shown(text: str) -> str:
    return quoted(text, chars=QUOTED_CHARS)


@dataclasses.dataclass(frozen=True)
class ImageRef:
    domain: str
    path: str
    tag: str | None
    digest: str | None
    # The name exactly as written (``ubuntu``, ``127.0.0.1:5000/kb/x``), for rewriting.
    written_name: str

    @property
    def name(self) -> str:
        """``host/repository``, canonical."""
        return f"{self.domain}/{self.path}"

    # The name is written out below rather than read through ``name``: every review asks
    # these of every governed image, several times.
    def __str__(self) -> str:
        return (
            f"{self.domain}/{self.path}"
            + (f":{self.tag}" if self.tag else "")
            + (f"@{self.digest}" if self.digest else "")
        )

    def by_digest(self) -> str:
        """``host/repository@digest``, the form verification and the cache key use."""
        if self.digest is None:
            raise ValueError(f"{self} has no digest")
        return f"{self.domain}/{self.path}@{self.digest}"

    @property
    def target(self) -> str:
        """What is verified: the digest when one is given (it wins over a tag), else the tag."""
        if self.digest:
            return f"{self.domain}/{self.path}@{self.digest}"
        return f"{self.domain}/{self.path}:{self.tag}" if self.tag else f"{self.domain}/{self.path}"

    def rewritten(self, digest: str) -> str:
        """The reference to run: the name as the user wrote it, pinned to ``digest``.

        The tag is dropped: ``name:tag@digest`` would make every later review (and every pod a
        controller creates from the template) carry a "tag and digest" warning, and the tag
        no longer decides anything.
        """
        return f"{self.written_name}@{digest}"


def parse_reference(text: str) -> ImageRef:
    if not isinstance(text, str) or not text or text != text.strip():
        raise InvalidReference(f"image {_shown(text)} is empty or has surrounding whitespace")
    rest, at, digest = text.partition("@")
    _refuse_dotted_brackets(text, split_registry(rest)[0])
    if at and not is_digest(digest):
        if not _OTHER_DIGEST.fullmatch(digest):
            raise InvalidReference(
                f"image reference {_shown(text)}: digest {_shown(digest)} is not sha256:<64 hex digits>"
            )
        ref = oci.parse_reference(rest)
    else:
        ref = oci.parse_reference(text)
    colon = rest.rfind(":")
    written_tag = colon > rest.rfind("/")
    return ImageRef(
        domain=ref.registry,
        path=ref.repository,
        tag=ref.tag if written_tag else None,
        digest=digest if at else None,
        written_name=rest[:colon] if written_tag else rest,
    )


def _refuse_dotted_brackets(text: str, host: str) -> None:
    """``[::ffff:127.0.0.1]:5000``: the distribution reference grammar (what container runtimes
    parse with) allows only hex digits and colons between brackets, so no runtime pulls this;
    it is unreadable like any bad host, and the message names the spelling that works."""
    if not (host.startswith("[") and "." in host.partition("]")[0]):
        return
    try:
        instead = canonical_host(host)
    except InvalidHost:
        return  # not an address at all: the parser's own message
    raise InvalidReference(
        f"image reference {_shown(text)}: registry host {_shown(host)} has a dotted IPv4 address between "
        f"brackets, which container runtimes do not accept as a reference; write {instead}"
    )


def alias_names(ref: ImageRef) -> tuple[str, ...]:
    """Names that may reach the same repository through another spelling of its server (every
    loopback name for one port, with and without ``:80``): a policy governing one of them must
    not let the reference through unverified."""
    return tuple(f"{host}/{ref.path}" for host in sorted(aliases(ref.domain)))


def normalise_pattern(pattern: str) -> str:
    """A policy pattern in the canonical spelling (``ubuntu`` → ``docker.io/library/ubuntu``,
    ``LOCALHOST:05000/kb/**`` → ``localhost:5000/kb/**``)."""
    first, slash, rest = pattern.partition("/")
    # A glob in the first segment can only be meant as a host (``*.example.com/**``).
    domain, path = (first, rest) if slash and "*" in first else split_registry(pattern)
    if path != path.lower():
        raise InvalidReference(
            f"pattern {_shown(pattern)}: repository paths are lowercase, {_shown(path)} is not"
        )
    if domain != DOCKER_HUB:
        try:
            domain = canonical_host_pattern(domain)
        except InvalidHost as exc:
            raise InvalidReference(f"pattern {_shown(pattern)}: {exc}") from None
    if domain == DOCKER_HUB and "/" not in path and path != "**":
        path = f"library/{path}"
    return f"{domain}/{path}"


def matches(name: str, pattern: str) -> bool:
    """Glob over ``/``-separated segments: ``*`` stays inside one segment, ``**`` spans any number
    (including none). Both arguments are normalised names/patterns."""
    return _match(tuple(name.split("/")), tuple(pattern.split("/")))


def _match(name: Sequence[str], pattern: Sequence[str]) -> bool:
    # Dynamic programming over (pattern position, name position): time is the product of the
    # two lengths whatever the number of ``**`` (trying every split recursively is exponential
    # in it, and the name is the pod author's to choose).
    # reach[j]: the first i pattern segments can match the first j name segments.
    reach = [True] + [False] * len(name)
    for head in pattern:
        if head == "**":
            for j in range(1, len(reach)):
                reach[j] = reach[j] or reach[j - 1]
        else:
            # Equal first: an IPv6 host (``[::1]:5000``) is a glob character class to fnmatch.
            reach = [False] + [
                reach[j] and (head == name[j] or fnmatch.fnmatchcase(name[j], head)) for j in range(len(name))
            ]
    return reach[-1]
