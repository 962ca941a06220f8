"""Keyless signing and verification through sigstore-python.

Imported only when keyless is used: sigstore-python costs ~0.3 s to import, which key-based
verification (the admission hot path for air-gapped fleets) should not pay.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import requests
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from sigstore.dsse import Statement
from sigstore.errors import CertValidationError, Error, VerificationError
from sigstore.models import Bundle, ClientTrustConfig, InvalidBundle, TrustedRoot
from sigstore.oidc import IdentityToken
from sigstore.sign import SigningContext
from sigstore.verify import Verifier

from kernelbake.errors import BadInput
from kernelbake.signing import formats
from kernelbake.signing._internal import certs
from kernelbake.signing.errors import (
    InvalidSignature,
    MalformedSignature,
    SigningServiceError,
    TokenExpired,
    TokenMalformed,
    TrustRootUnavailable,
    UntrustedSigner,
)
from kernelbake.signing.policy import PUBLIC_GOOD, IdentityRule
from kernelbake.signing.signer import LegacySignature, SignedStatement

STAGING = "sigstore-staging"
AUDIENCE = "sigstore"
_REQUIRED_CLAIMS = ("iss", "sub", "aud", "iat", "exp")


# -- trust --------------------------------------------------------------------------------


def load_trust_config(value: str) -> ClientTrustConfig:
    """``sigstore-public-good``, ``sigstore-staging`` (both through TUF) or a trust config file."""
    try:
        if value == PUBLIC_GOOD:
            return ClientTrustConfig.production()
        if value == STAGING:
            return ClientTrustConfig.staging()
    except (Error, OSError, requests.RequestException) as exc:
        raise SigningServiceError(f"cannot fetch the {value} trust config through TUF: {exc}") from None
    path = Path(value)
    try:
        return ClientTrustConfig.from_json(path.read_text())
    except OSError as exc:
        raise BadInput(f"{path}: cannot read trust config ({exc.strerror})") from None
    except (ValueError, Error) as exc:
        raise BadInput(f"{path}: not a Sigstore client trust config ({str(exc).splitlines()[0]})") from None


_verifiers: dict[tuple[str, float], Verifier] = {}


def verifier_for(trusted_root: str) -> Verifier:
    """A cached sigstore Verifier for a trusted root file (reloaded when the file changes)."""
    try:
        if trusted_root == PUBLIC_GOOD:
            key = (trusted_root, 0.0)
            if key not in _verifiers:
                _verifiers[key] = Verifier(trusted_root=ClientTrustConfig.production().trusted_root)
            return _verifiers[key]
        key = (trusted_root, Path(trusted_root).stat().st_mtime)
        if key not in _verifiers:
            _verifiers[key] = Verifier(trusted_root=TrustedRoot.from_file(trusted_root))
        return _verifiers[key]
    except (OSError, ValueError, Error, requests.RequestException) as exc:
        raise TrustRootUnavailable(f"cannot load trusted root {trusted_root}: {exc}") from None


# -- identity tokens ----------------------------------------------------------------------


def _b64url_json(part: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (binascii.Error, ValueError):
        raise TokenMalformed(f"OIDC token: {what} is not base64url JSON") from None
    if not isinstance(doc, dict):
        raise TokenMalformed(f"OIDC token: {what} is not a JSON object")
    return doc


def check_token(raw: str, *, now: float | None = None) -> dict[str, Any]:
    """Claims of an identity token, after the checks Fulcio would make on their shape and dates.

    We do this before sigstore-python so that "expired" and "malformed" are told apart by
    type, not by parsing its messages; the signature is Fulcio's to check.
    """
    parts = raw.strip().split(".")
    if len(parts) != 3 or not all(parts[:2]):
        raise TokenMalformed("OIDC token is not a JWT (expected header.payload.signature)")
    _b64url_json(parts[0], "header")
    claims = _b64url_json(parts[1], "payload")
    missing = [c for c in _REQUIRED_CLAIMS if c not in claims]
    if missing:
        raise TokenMalformed(f"OIDC token lacks claims {', '.join(missing)}")
    aud = claims["aud"]
    if AUDIENCE not in (aud if isinstance(aud, list) else [aud]):
        raise TokenMalformed(f"OIDC token audience {aud!r} does not include {AUDIENCE!r}")
    for name in ("exp", "iat") + (("nbf",) if "nbf" in claims else ()):
        if not isinstance(claims[name], int | float) or isinstance(claims[name], bool):
            raise TokenMalformed(f"OIDC token claim {name}={claims[name]!r} is not a number")
    t = time.time() if now is None else now
    if claims["exp"] <= t:
        raise TokenExpired(
            f"OIDC token for {claims.get('sub')!r} expired {int(t - claims['exp'])}s ago",
            hint="fetch a fresh token",
        )
    if claims.get("nbf", 0) > t + 5:
        raise TokenExpired(f"OIDC token for {claims.get('sub')!r} is not valid yet (nbf in the future)")
    return claims


# -- signing ------------------------------------------------------------------------------


def _tlog_annotation(bundle_doc: Mapping[str, Any]) -> str:
    """cosign's legacy ``dev.sigstore.cosign/bundle`` annotation (the Rekor SET and entry)."""
    entry = bundle_doc["verificationMaterial"]["tlogEntries"][0]
    return json.dumps(
        {
            "SignedEntryTimestamp": entry["inclusionPromise"]["signedEntryTimestamp"],
            "Payload": {
                "body": entry["canonicalizedBody"],
                "integratedTime": int(entry["integratedTime"]),
                "logIndex": int(entry["logIndex"]),
                "logID": base64.b64decode(entry["logId"]["keyId"]).hex(),
            },
        },
        separators=(",", ":"),
    )


class KeylessSigner:
    """Signs with a short-lived Fulcio certificate for the token's identity; every signature is
    logged in Rekor. The certificate is requested once and reused while it is valid."""

    def __init__(self, trust_config: ClientTrustConfig, token: str) -> None:
        claims = check_token(token)
        try:
            identity = IdentityToken(token.strip())
        except Error as exc:
            raise TokenMalformed(f"OIDC token rejected: {exc}") from None
        self._identity = f"{identity.identity} (issuer {claims['iss']})"
        self._chain = [
            c.public_bytes(serialization.Encoding.PEM).decode()
            for c in trust_config.trusted_root.get_fulcio_certs()
        ]
        try:
            self._ctx = SigningContext.from_trust_config(trust_config)
            self._fulcio_url = trust_config.signing_config.get_fulcio().url
            with self._ctx.signer(identity, cache=True) as signer:
                self._signer = signer
        except Exception as exc:
            raise self._service_error("get a signing certificate", exc) from None

    def _service_error(self, doing: str, exc: Exception) -> SigningServiceError:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, requests.RequestException):
            detail = f"unreachable ({type(exc).__name__})"
        return SigningServiceError(f"keyless signing: could not {doing}: {detail}")

    @property
    def identity(self) -> str:
        return self._identity

    def _legacy_annotations(self, bundle_doc: Mapping[str, Any]) -> dict[str, str]:
        raw = base64.b64decode(bundle_doc["verificationMaterial"]["certificate"]["rawBytes"])
        cert = x509.load_der_x509_certificate(raw).public_bytes(serialization.Encoding.PEM).decode()
        return {
            formats.ANN_CERTIFICATE: cert,
            formats.ANN_CHAIN: "".join(self._chain),
            formats.ANN_REKOR_BUNDLE: _tlog_annotation(bundle_doc),
        }

    def sign_statement(self, statement: bytes) -> SignedStatement:
        try:
            bundle = self._signer.sign_dsse(Statement(statement))
        except Exception as exc:
            raise self._service_error("sign and log the statement", exc) from None
        text = bundle.to_json()
        doc = json.loads(text)
        envelope = json.dumps(doc["dsseEnvelope"], separators=(",", ":")).encode()
        return SignedStatement(text.encode(), envelope, self._legacy_annotations(doc))

    def sign_payload(self, payload: bytes) -> LegacySignature:
        try:
            bundle = self._signer.sign_artifact(payload)
        except Exception as exc:
            raise self._service_error("sign and log the payload", exc) from None
        doc = json.loads(bundle.to_json())
        return LegacySignature(doc["messageSignature"]["signature"], self._legacy_annotations(doc))


# -- verification -------------------------------------------------------------------------


class _RulesPolicy:
    """sigstore VerificationPolicy: the certificate matches one of the policy's identities."""

    def __init__(self, rules: Sequence[IdentityRule]) -> None:
        self._rules = list(rules)

    def verify(self, cert: x509.Certificate) -> None:
        if not self._rules or not any(
            r.matches(certs.issuer(cert), certs.subjects(cert)) for r in self._rules
        ):
            raise VerificationError(f"certificate identity {certs.describe(cert)} is not trusted")


def verify_bundle(
    data: bytes, rules: Sequence[IdentityRule], trusted_root: str, *, source: str
) -> tuple[str, str, bytes]:
    """(signer, payload type, payload) of a keyless DSSE bundle that satisfies ``rules``."""
    try:
        bundle = Bundle.from_json(data)
    except (InvalidBundle, ValueError, Error) as exc:
        raise MalformedSignature(
            f"{source}: not a valid Sigstore bundle ({str(exc).splitlines()[0]})"
        ) from None
    cert = bundle.signing_certificate
    matching = [r for r in rules if r.matches(certs.issuer(cert), certs.subjects(cert))]
    if not matching:
        trusted = "; ".join(str(r) for r in rules) or "no identities"
        raise UntrustedSigner(f"{source}: signed by {certs.describe(cert)}; the policy trusts {trusted}")
    verifier = verifier_for(trusted_root)
    try:
        payload_type, payload = verifier.verify_dsse(bundle, _RulesPolicy(matching))
    except CertValidationError as exc:
        raise UntrustedSigner(
            f"{source}: certificate for {certs.describe(cert)} does not chain to the trusted root ({exc})"
        ) from None
    except (VerificationError, Error, ValueError) as exc:
        raise InvalidSignature(
            f"{source}: keyless signature does not verify: {str(exc).splitlines()[0]}"
        ) from None
    return f"{certs.describe(cert)}", payload_type, payload
