"""Registry failures, by cause. All are ``RegistryError`` (exit code 5); callers that must tell
an outage from a missing object (verification, admission) catch the subclasses."""

from __future__ import annotations

from kernelbake.errors import RegistryError


class RegistryNotFound(RegistryError):
    """The registry answered 404 for the object asked for (repository, tag, manifest or blob)."""


class RegistryUnreachable(RegistryError):
    """No answer: connection refused, DNS failure or timeout."""


class DeadlineExceeded(RegistryUnreachable):
    """A call did not finish within its total deadline (a slow or dripping registry)."""


class RegistryServerError(RegistryError):
    """The registry answered 5xx."""


class RegistryDenied(RegistryError):
    """401/403 after authenticating (or with no credentials for it)."""


class RegistryProtocolError(RegistryError):
    """An answer we cannot use: wrong digest, too large, not JSON, unexpected status."""
