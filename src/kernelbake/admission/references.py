"""Image references as Kubernetes and the registry understand them (distribution's grammar).

``parse_reference("127.0.0.1:5000/kb/qwen3:tag")`` gives the registry host, the repository path,
the tag and the digest; ``docker.io`` names are normalised (``ubuntu`` → ``docker.io/library/ubuntu``)
so that policy patterns see one spelling. The text the user wrote for the name is kept, so a
rewritten reference changes only what must change.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Sequence

from kernelbake.errors import BadInput

DOCKER_HUB = "docker.io"
_HUB_ALIASES = ("index.docker.io", "registry-1.docker.io")

_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?"
)
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}")
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
_MAX_NAME = 255


class InvalidReference(BadInput, ValueError):
    """Not an image reference the container runtime could pull; quotes the input."""


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

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    def by_digest(self) -> str:
        """``host/repository@digest``, the form verification and the cache key use."""
        if self.digest is None:
            raise ValueError(f"{self} has no digest")
        return f"{self.name}@{self.digest}"

    def rewritten(self, digest: str) -> str:
        """The reference to run: the user's name and tag, pinned to ``digest``.

        The tag stays for people reading ``kubectl get pods``; container runtimes pull by the
        digest when both are present.
        """
        return self.written_name + (f":{self.tag}" if self.tag else "") + f"@{digest}"


def parse_reference(text: str) -> ImageRef:
    if not isinstance(text, str) or not text or text != text.strip():
        raise InvalidReference(f"image {text!r} is empty or has surrounding whitespace")
    rest, at, digest = text.partition("@")
    if at:
        if not _DIGEST.fullmatch(digest):
            raise InvalidReference(f"image {text!r}: {digest!r} is not a digest (algorithm:hex)")
        if digest.startswith("sha256:") and not _SHA256.fullmatch(digest):
            raise InvalidReference(f"image {text!r}: a sha256 digest is 64 lowercase hex characters")
    name, tag = rest, None
    slash, colon = rest.rfind("/"), rest.rfind(":")
    if colon > slash:
        name, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise InvalidReference(f"image {text!r}: {tag!r} is not a valid tag")
    if len(name) > _MAX_NAME:
        raise InvalidReference(f"image {text!r}: the name is longer than {_MAX_NAME} characters")
    domain, path = _split_domain(name, text)
    for component in path.split("/"):
        if not _COMPONENT.fullmatch(component):
            raise InvalidReference(
                f"image {text!r}: repository component {component!r} is not lowercase letters, digits and separators"
            )
    return ImageRef(domain, path, tag, digest or None, name)


def _split_domain(name: str, text: str) -> tuple[str, str]:
    first, slash, remainder = name.partition("/")
    # distribution's rule: the first component is a registry host when it looks like one.
    if slash and ("." in first or ":" in first or first == "localhost" or first.lower() != first):
        if not _HOST.fullmatch(first):
            raise InvalidReference(f"image {text!r}: {first!r} is not a registry host[:port]")
        domain, path = first, remainder
    else:
        domain, path = DOCKER_HUB, name
    if domain in _HUB_ALIASES:
        domain = DOCKER_HUB
    if domain == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not path:
        raise InvalidReference(f"image {text!r} names no repository")
    return domain, path


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
