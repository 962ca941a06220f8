"""Image references as admission needs them, on top of ``kernelbake.oci``'s parser.

Two things admission needs beyond it: whether a tag was *written* (the registry reads a bare
name as ``:latest``, admission denies it), and the name exactly as written, so a rewritten
reference changes only what must change. ``docker.io`` names are normalised
(``ubuntu`` → ``docker.io/library/ubuntu``) so that policy patterns see one spelling.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Sequence

from kernelbake import oci
from kernelbake.oci import InvalidReference

__all__ = ["ImageRef", "InvalidReference", "loose_name", "matches", "normalise_pattern", "parse_reference"]

DOCKER_HUB = "docker.io"
_HUB_ALIASES = ("index.docker.io", "registry-1.docker.io")


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
        """``host/repository``, normalised."""
        return f"{self.domain}/{self.path}"

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    def by_digest(self) -> str:
        """``host/repository@digest``, the form verification and the cache key use."""
        if self.digest is None:
            raise ValueError(f"{self} has no digest")
        return f"{self.name}@{self.digest}"

    def rewritten(self, digest: str) -> str:
        """The reference to run: the name as the user wrote it, pinned to ``digest``.

        The tag is dropped: ``name:tag@digest`` would make every later review (and every pod a
        controller creates from the template) carry a "tag and digest" warning, and the tag
        no longer decides anything.
        """
        return f"{self.written_name}@{digest}"


def parse_reference(text: str) -> ImageRef:
    if not isinstance(text, str) or not text or text != text.strip():
        raise InvalidReference(f"image {text!r} is empty or has surrounding whitespace")
    ref = oci.parse_reference(text)
    rest = text.partition("@")[0]
    colon = rest.rfind(":")
    written_tag = colon > rest.rfind("/")
    domain = DOCKER_HUB if ref.registry in _HUB_ALIASES else ref.registry
    return ImageRef(
        domain=domain,
        path=ref.repository,
        tag=ref.tag if written_tag else None,
        digest=ref.digest,
        written_name=rest[:colon] if written_tag else rest,
    )


def normalise_pattern(pattern: str) -> str:
    """A policy pattern in the normalised spelling (``ubuntu`` → ``docker.io/library/ubuntu``)."""
    first, slash, rest = pattern.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or "*" in first):
        domain, path = first, rest
    else:
        domain, path = DOCKER_HUB, pattern
    if domain in _HUB_ALIASES:
        domain = DOCKER_HUB
    if domain == DOCKER_HUB and "/" not in path and path != "**":
        path = f"library/{path}"
    return f"{domain}/{path}"


def matches(name: str, pattern: str) -> bool:
    """Glob over ``/``-separated segments: ``*`` stays inside one segment, ``**`` spans any number
    (including none). Both arguments are normalised names/patterns."""
    return _match(tuple(name.split("/")), tuple(pattern.split("/")))


def _match(name: Sequence[str], pattern: Sequence[str]) -> bool:
    if not pattern:
        return not name
    head, tail = pattern[0], pattern[1:]
    if head == "**":
        return any(_match(name[i:], tail) for i in range(len(name) + 1))
    return bool(name) and fnmatch.fnmatchcase(name[0], head) and _match(name[1:], tail)


def loose_name(text: str) -> str | None:
    """Best guess at the normalised name of something that failed to parse, so a broken reference
    into a governed repository is denied rather than waved through."""
    candidate = text.strip().split("@", 1)[0]
    slash, colon = candidate.rfind("/"), candidate.rfind(":")
    if colon > slash:
        candidate = candidate[:colon]
    if not candidate:
        return None
    return normalise_pattern(candidate.lower())
