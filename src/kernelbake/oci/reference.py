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
# One DNS label (or the run of a one-label name). Matched per label with ``fullmatch``, never
# as a repeated group over the whole host: the old ``(?:label\.?)+`` could split a run of
# letters into labels in exponentially many ways, and ``AAAA…A_`` took seconds to refuse.
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?")
_PORT = re.compile(r"[0-9]+")
# The distribution grammar: hex digits and colons only (no dotted IPv4 tail), so no runtime
# pulls ``[::ffff:127.0.0.1]``; admission names the spelling to write instead.
_IPV6 = re.compile(r"[0-9A-Fa-f:]{2,39}")
# The distribution reference grammar's bounds: a name (host and path) of at most 255
# characters, a tag of at most 128, a digest of a fixed size. Longer text is refused before
# any pattern runs, so every reference costs time linear in at most this many characters.
NAME_MAX = 255
REFERENCE_MAX = NAME_MAX + 1 + 128 + 1 + len("sha512:") + 128


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
    if len(raw) > REFERENCE_MAX:
        raise InvalidReference(
            f"image reference {raw[:64]!r}… is {len(raw)} characters long; "
            f"references have at most {REFERENCE_MAX} (names at most {NAME_MAX})"
        )
    rest, at, digest = raw.partition("@")
    if at and not is_digest(digest):
        raise InvalidReference(f"image reference {text!r}: digest {digest!r} is not sha256:<64 hex digits>")
    registry, path = split_registry(rest)
    if registry != DOCKER_HUB:
        if not is_host_syntax(registry):
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
    # The name as written: ``rest`` without its tag.
    if len(rest) - (len(tag) + 1 if tag is not None else 0) > NAME_MAX:
        raise InvalidReference(f"image reference {text!r}: the name is longer than {NAME_MAX} characters")
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not _REPOSITORY.fullmatch(path):
        raise InvalidReference(
            f"image reference {text!r}: bad repository {path!r} (lowercase letters, digits, . _ - and /)"
        )
    if tag is None and not at:
        tag = "latest"
    return Reference(registry=registry, repository=path, tag=tag, digest=digest if at else None)


def is_host_syntax(host: str) -> bool:
    """``host[:port]`` or ``[ipv6][:port]`` as the reference grammar spells a registry, checked in
    time linear in the length (labels one at a time; see ``_LABEL``)."""
    if host.startswith("["):
        end = host.find("]")
        rest = host[end + 1 :]
        return (
            end > 0
            and _IPV6.fullmatch(host[1:end]) is not None
            and (not rest or (rest[0] == ":" and _PORT.fullmatch(rest[1:]) is not None))
        )
    name, colon, port = host.partition(":")
    if colon and _PORT.fullmatch(port) is None:
        return False
    labels = name.split(".")
    if len(labels) > 1 and labels[-1] == "":
        labels.pop()  # one trailing dot: the DNS root
    return all(_LABEL.fullmatch(label) for label in labels)


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
