"""Registry hosts in the one spelling a container runtime ends up talking to.

A policy that governs ``localhost:5055/kernelbake/**`` must also govern ``LOCALHOST:5055/…``,
``localhost.:5055/…`` and ``127.1:5055/…`` when the runtime reaches the same server through
them; otherwise another spelling of the host is a way around admission. ``canonical_host``
maps every spelling that is *certainly* the same server to one string:

- DNS names are case-insensitive: lowercased; one trailing dot (the root) is dropped;
- IPv4 addresses in the forms the C resolver accepts (``127.1``, ``0x7f.0.0.1``,
  ``2130706433``, ``0177.0.0.1``) become dotted quads; IPv6 addresses are compressed, and an
  IPv4-mapped one (``[::ffff:7f00:1]``) is its IPv4 address (``[::ffff:127.0.0.1]`` is the
  same address, but no runtime accepts it in a reference: the distribution grammar allows only
  hex digits and colons between brackets);
- port numbers lose leading zeros, and ``:443`` (the HTTPS default) is dropped;
- Docker Hub's other names (``index.docker.io``, ``registry-1.docker.io``,
  ``registry.hub.docker.com``) are ``docker.io``.

``aliases`` lists spellings that *may* reach the same server but cannot be proven to from the
name alone: every loopback name for one port (``localhost``, ``127.0.0.1``, ``[::1]``, any
127/8 address, and the unspecified addresses ``0.0.0.0`` and ``[::]``, which a connection on
Linux takes to the local host), and a host with and without ``:80`` (a plain-HTTP registry's
default). Names that reach a server through /etc/hosts or DNS cannot be seen from here: a
policy's ``unlisted_registries: deny`` is the answer to those.
Admission denies a reference whose alias is governed, naming the spelling to write instead.
"""

from __future__ import annotations

import ipaddress
import re
import socket

from kernelbake.errors import BadInput
from kernelbake.validate import quoted

DOCKER_HUB = "docker.io"
HUB_ALIASES = frozenset({"index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"})

_LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
# What inet_aton might read as an address: digits, hex digits, 'x' and dots, starting with a digit.
_NUMERIC = re.compile(r"[0-9][0-9a-fx.]*")
# Connecting to the unspecified address reaches the local host (Linux), so it is a loopback
# name too.
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]", "0.0.0.0", "[::]")

# A reference (or host) is quoted whole up to this length, more than any real one holds
# (a 255-character name, a 128-character tag, a digest): a longer one is cut in messages.
QUOTED_CHARS = 512


def _shown(text: str) -> str:
    return quoted(text, chars=QUOTED_CHARS)


class InvalidHost(BadInput, ValueError):
    """A registry host that no runtime could reach; quotes it."""


def canonical_host(text: str) -> str:
    """``host[:port]`` in its canonical spelling (see the module docstring)."""
    name, port = _split(text)
    if port is not None:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidHost(
                f"registry host {_shown(text)}: port {_shown(port)} is not a number from 1 to 65535"
            )
        port = str(int(port))
        if port == "443":
            port = None
    host = _canonical_name(name, text)
    if port is None and "." not in host and host != "localhost" and not host.startswith("["):
        # ``MyHost/x`` names the registry MyHost only because of its capital; lowercased it
        # would read as the Docker Hub namespace ``myhost``: no canonical spelling exists.
        raise InvalidHost(
            f"registry host {_shown(text)}: a one-label host without a port has no canonical spelling "
            "(lowercased it reads as a Docker Hub namespace); write its port or full domain"
        )
    if host in HUB_ALIASES:
        host = DOCKER_HUB
    return host if port is None else f"{host}:{port}"


def canonical_host_pattern(text: str) -> str:
    """A policy's host glob: canonical where it has no wildcard, lowercased where it does."""
    if "*" not in text and "?" not in text and "[" not in text.lstrip("["):
        return canonical_host(text)
    name, port = _split(text)
    name = name.lower().removesuffix(".")
    if port == "443":
        port = None
    return name if port is None else f"{name}:{port}"


def aliases(host: str) -> frozenset[str]:
    """Other canonical spellings that may reach the server ``host`` (canonical) names."""
    name, port = _split(host)
    found = {host}
    if _is_loopback(name):
        found |= {n if port is None else f"{n}:{port}" for n in _LOOPBACK_NAMES}
    for spelling in tuple(found):
        bare, p = _split(spelling)
        if p is None:
            found.add(f"{spelling}:80")
        elif p == "80":
            found.add(bare)
    found.discard(host)
    return frozenset(found)


def _split(text: str) -> tuple[str, str | None]:
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise InvalidHost(f"registry host {_shown(text)}: unclosed '['")
        rest = text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise InvalidHost(f"registry host {_shown(text)}: expected ':port' after ']'")
        return text[: end + 1], rest[1:] if rest else None
    name, colon, port = text.partition(":")
    return name, port if colon else None


def _canonical_name(name: str, text: str) -> str:
    if name.startswith("["):
        try:
            address = ipaddress.IPv6Address(name[1:-1])
        except ValueError:
            raise InvalidHost(
                f"registry host {_shown(text)}: {_shown(name)} is not an IPv6 address"
            ) from None
        mapped = address.ipv4_mapped
        return str(mapped) if mapped is not None else f"[{address.compressed}]"
    lowered = name.lower()
    if lowered.endswith("."):
        lowered = lowered[:-1]
    if _NUMERIC.fullmatch(lowered):
        try:
            # The resolver's reading of numeric hosts, which is what the runtime connects to.
            return socket.inet_ntoa(socket.inet_aton(lowered))
        except OSError:
            pass  # not an address (``123abc.de``): a name, checked below
    if not _NAME.fullmatch(lowered) or len(lowered) > 253:
        raise InvalidHost(
            f"registry host {_shown(text)}: {_shown(name)} is not a valid DNS name or IP address"
        )
    return lowered


def _is_loopback(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified
