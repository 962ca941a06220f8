"""Why signing or verification failed. One class per cause, each with its own exit code, and a
one-line message naming the image (``repo@digest``) and what to do.

Verification codes are 10-29, signing codes 30-39. The registry-trouble classes
(``RegistryServerFailure``, ``RegistryTimeout``, ``RegistryAccessDenied``) are also
``kernelbake.oci.RegistryUnavailable``: "could not ask", not "asked and it was bad"; admission may
choose to fail open on those only. ``ImageNotFound`` is also ``kernelbake.oci.RegistryNotFound``:
the registry answered. A registry that answers with content that does not match its digest is
*not* unavailable (``RegistryMisbehaved``): that is an integrity failure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kernelbake.errors import BadInput, KernelbakeError
from kernelbake.oci.errors import (
    RegistryDenied,
    RegistryNotFound,
    RegistryProtocolError,
    RegistryServerError,
    RegistryUnavailable,
    RegistryUnreachable,
)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class _OneLine(KernelbakeError):
    """Message and hint on one line each: causes quoted from sigstore, cryptography or a registry
    may span lines; ours never do."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(_one_line(message), hint=_one_line(hint) if hint else None)


class VerificationFailed(_OneLine):
    """Base of every verification failure; never means "verified"."""

    return_code = 10


class Unsigned(VerificationFailed):
    """No signature of any format is attached to the digest."""

    return_code = 11


class UntrustedSigner(VerificationFailed):
    """Signatures exist, but none is by a key or identity the policy trusts."""

    return_code = 12


class InvalidSignature(VerificationFailed):
    """A signature claims a trusted signer but does not verify: corrupted or tampered."""

    return_code = 13


class MalformedSignature(VerificationFailed):
    """A signature artifact (bundle, envelope, payload) cannot be parsed."""

    return_code = 14


class SubjectMismatch(VerificationFailed):
    """A trusted signature is attached, but it was made for another digest."""

    return_code = 15


class TagMoved(VerificationFailed):
    """``repo:tag@digest`` was given and the tag now points elsewhere."""

    return_code = 16


class MissingAttestation(VerificationFailed):
    """Signed, but no trusted kernelbake attestation for this digest."""

    return_code = 17


class LabelMismatch(VerificationFailed):
    """The image's labels disagree with each other or with the attested key."""

    return_code = 18


class CacheManifestMismatch(VerificationFailed):
    """The cache manifest in the image is not the one attested."""

    return_code = 19


class ImageNotFound(VerificationFailed, RegistryNotFound):
    """The registry answered 404 for the image."""

    return_code = 21


class RegistryServerFailure(VerificationFailed, RegistryUnavailable):
    """The registry answered 5xx."""

    return_code = 22


class RegistryTimeout(VerificationFailed, RegistryUnavailable):
    """No answer from the registry: timeout or connection refused."""

    return_code = 23


class RegistryAccessDenied(VerificationFailed, RegistryUnavailable):
    """The registry refused our credentials (401/403)."""

    return_code = 24


class NotKernelbakeImage(VerificationFailed):
    """The image carries no kernelbake key label: not built by kernelbake."""

    return_code = 25


class TrustRootUnavailable(VerificationFailed):
    """The Sigstore trusted root named by the policy could not be loaded."""

    return_code = 26


class RegistryMisbehaved(VerificationFailed):
    """The registry sent content that does not match its digest, or nonsense."""

    return_code = 27


class InvalidImageReference(VerificationFailed, BadInput):
    """The image reference does not parse (so nothing was verified); also a ``BadInput``."""

    return_code = 28


class DeltaRefused(VerificationFailed):
    """A cache delta that is not for this image: another base digest or key, or not a delta."""

    return_code = 29


class SnapshotRefused(VerificationFailed):
    """A process snapshot that is not for this image: another subject or key, unsigned, or not
    a snapshot."""

    return_code = 20


class SigningFailed(_OneLine):
    """Base of signing failures."""

    return_code = 30


class TokenMissing(SigningFailed):
    """Keyless signing without an OIDC identity token."""

    return_code = 31


class TokenExpired(SigningFailed):
    """The OIDC identity token is expired or not yet valid."""

    return_code = 32


class TokenMalformed(SigningFailed):
    """The OIDC identity token is not a JWT Sigstore accepts."""

    return_code = 33


class SigningServiceError(SigningFailed):
    """Fulcio or Rekor refused the request or could not be reached."""

    return_code = 34


@contextlib.contextmanager
def registry_errors(where: str, *, missing_is_image: bool) -> Iterator[None]:
    """The registry's trouble while reading ``where`` as the verification failure it is:
    unavailable (timeout, server error, denied) or misbehaving; a missing manifest is
    ``ImageNotFound`` when it is the image asked for (``missing_is_image``), else the registry
    listing content it does not serve."""
    try:
        yield
    except RegistryNotFound as exc:
        if missing_is_image:
            raise ImageNotFound(f"{where}: image not found ({exc})") from None
        raise RegistryMisbehaved(f"{where}: registry lists content it does not serve ({exc})") from None
    except RegistryUnreachable as exc:
        raise RegistryTimeout(f"{where}: registry unavailable: {exc}") from None
    except RegistryServerError as exc:
        raise RegistryServerFailure(f"{where}: registry unavailable: {exc}") from None
    except RegistryDenied as exc:
        raise RegistryAccessDenied(f"{where}: registry unavailable: {exc}") from None
    except RegistryProtocolError as exc:
        raise RegistryMisbehaved(f"{where}: {exc}") from None
