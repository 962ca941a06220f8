"""Everything kernelbake takes from sigstore-python beyond its public API, in one place.

Keyless verification of cosign 2's legacy signatures (a certificate and a Rekor SET in the
``.sig`` layer's annotations, no bundle) has no public entry point in sigstore-python: its
``Verifier`` takes bundles. kernelbake checks the SCT with sigstore's own code and names the
errors its clients raise, which live in private modules. pyproject pins sigstore to one minor
release, and ``tests/signing/test_sigstore_seam.py`` imports each name below, so a release
that moves one fails there with the name.
"""

from __future__ import annotations

from typing import Any

from sigstore._internal.fulcio.client import ExpiredCertificate, FulcioClientError
from sigstore._internal.rekor import RekorClientError
from sigstore._internal.sct import verify_sct
from sigstore._internal.trust import KeyringPurpose
from sigstore._utils import KeyID

# The property of ``sigstore.sign.Signer`` that gives its ephemeral private key.
EPHEMERAL_KEY_ATTRIBUTE = "_private_key"


def ephemeral_key(signer: object) -> Any:
    """The ephemeral private key a sigstore ``Signer`` signs with (an ``ec.EllipticCurvePrivateKey``)."""
    return getattr(signer, EPHEMERAL_KEY_ATTRIBUTE)


__all__ = [
    "ExpiredCertificate",
    "FulcioClientError",
    "KeyID",
    "KeyringPurpose",
    "RekorClientError",
    "ephemeral_key",
    "verify_sct",
]
