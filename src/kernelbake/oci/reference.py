"""Image references: ``host[:port]/repo[:tag][@sha256:hex]``, parsed once into a value type."""

from __future__ import annotations

import dataclasses
import re

from kernelbake.errors import BadInput

DOCKER_HUB = "docker.io"
# Where Docker Hub's API actually lives.
DOCKER_HUB_API = "registry-1.docker.io"

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.?)+(?::[0-9]+)?|\[[0-9a-fA-F:]+\](?::[0-9]+)?"
)


class InvalidReference(BadInput, ValueError):
    """An image reference that does not parse; quotes it."""


def is_digest(text: str) -> bool:
    return _DIGEST.fullmatch(text) is not None


def check_digest(text: str, *, what: str = "digest") -> str:
    if not is_digest(text):
        raise InvalidReference(f"{what} {text!r} is not sha256:<64 hex digits>")
    return text


@dataclasses.dataclass(frozen=True)
class Reference:
    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """``host/repo``, the form signatures and policies name an image by."""
        return f"{self.registry}/{self.repository}"

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    def with_digest(self, digest: str) -> Reference:
        return dataclasses.replace(self, digest=check_digest(digest))

    def with_tag(self, tag: str) -> Reference:
        if not _TAG.fullmatch(tag):
            raise InvalidReference(f"tag {tag!r} is not a valid OCI tag")
        return dataclasses.replace(self, tag=tag, digest=None)

    def pinned(self) -> str:
        """``host/repo@sha256:…`` (requires a digest)."""
        if self.digest is None:
            raise InvalidReference(f"{self} has no digest")
        return f"{self.name}@{self.digest}"

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def parse_reference(text: str) -> Reference:
    """Parse ``host/repo:tag``, ``host/repo@sha256:…`` or both; no tag and no digest means ``latest``.

    A first path component without ``.`` or ``:`` (and not ``localhost``) is a Docker Hub name,
    as docker reads it (``nginx`` → ``docker.io/library/nginx``).
    """
    raw = text.strip()
    rest, at, digest = raw.partition("@")
    if at and not is_digest(digest):
        raise InvalidReference(f"image reference {text!r}: digest {digest!r} is not sha256:<64 hex digits>")
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        registry, path = first, remainder
        if not _HOST.fullmatch(registry):
            raise InvalidReference(f"image reference {text!r}: bad registry host {registry!r}")
    else:
        registry, path = DOCKER_HUB, rest
    tag: str | None = None
    last_slash = path.rfind("/")
    colon = path.rfind(":")
    if colon > last_slash:
        path, tag = path[:colon], path[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise InvalidReference(f"image reference {text!r}: bad tag {tag!r}")
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not _REPOSITORY.fullmatch(path):
        raise InvalidReference(
            f"image reference {text!r}: bad repository {path!r} (lowercase letters, digits, . _ - and /)"
        )
    if tag is None and not at:
        tag = "latest"
    return Reference(registry=registry, repository=path, tag=tag, digest=digest if at else None)
