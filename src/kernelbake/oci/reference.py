"""Image references: ``host[:port]/repo[:tag][@sha256:hex]``, parsed once into a value type."""

from __future__ import annotations

import dataclasses
import re

from kernelbake.errors import BadInput
from kernelbake.oci.hosts import DOCKER_HUB, InvalidHost, canonical_host

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

    A first path component is the registry host when it has a ``.`` or ``:``, is ``localhost``
    or has an uppercase letter (the distribution reference rule container runtimes apply);
    otherwise the name is Docker Hub's (``nginx`` → ``docker.io/library/nginx``). The host is
    kept in its canonical spelling (``kernelbake.oci.hosts``), so every spelling of one server
    yields one name.
    """
    raw = text.strip()
    rest, at, digest = raw.partition("@")
    if at and not is_digest(digest):
        raise InvalidReference(f"image reference {text!r}: digest {digest!r} is not sha256:<64 hex digits>")
    registry, path = split_registry(rest)
    if registry != DOCKER_HUB:
        if not _HOST.fullmatch(registry):
            raise InvalidReference(f"image reference {text!r}: bad registry host {registry!r}")
        try:
            registry = canonical_host(registry)
        except InvalidHost as exc:
            raise InvalidReference(f"image reference {text!r}: {exc}") from None
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


def split_registry(name: str) -> tuple[str, str]:
    """``(host as written, rest)``, or ``("docker.io", name)`` when the name has no host."""
    first, slash, remainder = name.partition("/")
    if slash and (
        "." in first
        or ":" in first
        or first.lower() == "localhost"
        or first != first.lower()
        or first.startswith("[")
    ):
        return first, remainder
    return DOCKER_HUB, name
