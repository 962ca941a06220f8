"""Registry failures, by cause. All are ``RegistryError`` (exit code 5); callers that must tell
an outage from a missing object (verification, admission) catch the subclasses.

``RegistryUnavailable`` is the one "the registry could not answer" type: the verdict is unknown,
not bad. Verification's own registry failures subclass it, so a caller asks one question
whichever layer raised."""

from __future__ import annotations

from kernelbake.errors import RegistryError


class RegistryNotFound(RegistryError):
    """The registry answered 404 for the object asked for (repository, tag, manifest or blob)."""


class RegistryUnavailable(RegistryError):
    """The registry could not answer (down, 5xx, timeout, refused credentials): the verdict is
    unknown. Base of the outage classes; a 404 or a wrong digest is an answer, not an outage."""


class RegistryUnreachable(RegistryUnavailable):
    """No answer: connection refused, DNS failure or timeout."""


class DeadlineExceeded(RegistryUnreachable):
    """A call did not finish within its total deadline (a slow or dripping registry)."""


class RegistryServerError(RegistryUnavailable):
    """The registry answered 5xx."""


class RegistryDenied(RegistryUnavailable):
    """401/403 after authenticating (or with no credentials for it)."""


class RegistryProtocolError(RegistryError):
    """An answer we cannot use: wrong digest, too large, not JSON, unexpected status."""
