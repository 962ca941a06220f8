"""Keyless signing and verification through sigstore-python.

Imported only when keyless is used: sigstore-python costs ~0.3 s to import, which key-based
verification (the admission hot path for air-gapped fleets) should not pay.

Below the public layer: this module returns plain values and takes identities as a Protocol, so
it imports only leaf modules (errors, formats, instances), never ``signer`` or ``policy``. It
uses sigstore-python's private modules, which is why pyproject pins sigstore's minor version.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import requests
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from sigstore.dsse import Statement
from sigstore.errors import CertValidationError, Error, VerificationError
from sigstore.models import Bundle, ClientTrustConfig, InvalidBundle, TrustedRoot
from sigstore.oidc import ExpiredIdentity, IdentityToken
from sigstore.sign import SigningContext
from sigstore.verify import Verifier

import kernelbake.contract.jsondoc as jsondoc
from kernelbake.cache import BoundedCache
from kernelbake.errors import BadInput
from kernelbake.signing import formats
from kernelbake.signing._internal import certs
from kernelbake.signing._internal.instances import PUBLIC_GOOD, STAGING
from kernelbake.signing._internal.sigstore_private import (
    ExpiredCertificate,
    FulcioClientError,
    RekorClientError,
    ephemeral_key,
)
from kernelbake.signing.errors import (
    InvalidSignature,
    MalformedSignature,
    SigningServiceError,
    TokenExpired,
    TokenMalformed,
    TrustRootUnavailable,
    UntrustedSigner,
)
from kernelbake.textfile import read_text


class Identity(Protocol):
    """A trusted keyless identity (``kernelbake.signing.policy.IdentityRule``); ``str()`` names it."""

    def matches(self, issuer: str, subjects: Sequence[str], /) -> bool: ...


# What sigstore-python raises when Fulcio, Rekor or the network let signing down.
_SERVICE_ERRORS = (
    Error,
    FulcioClientError,
    RekorClientError,
    ExpiredCertificate,
    ExpiredIdentity,
    requests.RequestException,
    ValueError,
)
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
    text = read_text(path, "trust config")
    try:
        jsondoc.refuse_deep(text)
        return ClientTrustConfig.from_json(text)
    except (ValueError, RecursionError, Error) as exc:
        raise BadInput(f"{path}: not a Sigstore client trust config ({str(exc).splitlines()[0]})") from None


# Keyed by path and mtime, so a rewritten file is reloaded; bounded, so rewriting it often (or
# many policies) does not grow the process.
_roots: BoundedCache[tuple[str, float], tuple[TrustedRoot, Verifier]] = BoundedCache(16)


def _root(trusted_root: str) -> tuple[TrustedRoot, Verifier]:
    """The trusted root and a sigstore Verifier for it, cached (reloaded when the file changes)."""
    try:
        if trusted_root == PUBLIC_GOOD:
            key = (trusted_root, 0.0)
        else:
            key = (trusted_root, Path(trusted_root).stat().st_mtime)
        hit = _roots.get(key)
        if hit is not None:
            return hit
        if trusted_root == PUBLIC_GOOD:
            root = ClientTrustConfig.production().trusted_root
        else:
            root = TrustedRoot.from_file(trusted_root)
        loaded = (root, Verifier(trusted_root=root))
        _roots.put(key, loaded)
        return loaded
    except (OSError, ValueError, Error, requests.RequestException) as exc:
        raise TrustRootUnavailable(f"cannot load trusted root {trusted_root}: {exc}") from None


def verifier_for(trusted_root: str) -> Verifier:
    return _root(trusted_root)[1]


# -- identity tokens ----------------------------------------------------------------------


def _b64url_json(part: str, what: str) -> dict[str, Any]:
    try:
        doc = jsondoc.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
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


class KeylessSession:
    """Signs with a short-lived Fulcio certificate for the token's identity; every signature is
    logged in Rekor. The certificate is requested once and reused while it is valid.
    ``kernelbake.signing.signer.KeylessSigner`` is the public face."""

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
            with self._ctx.signer(identity, cache=True) as signer:
                self._signer = signer
        except _SERVICE_ERRORS as exc:
            raise self._service_error("get a signing certificate", exc) from None

    def _service_error(self, doing: str, exc: BaseException) -> SigningServiceError:
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

    def sign_statement(self, statement: bytes) -> tuple[bytes, bytes, dict[str, str]]:
        """(bundle JSON, its DSSE envelope JSON, legacy annotations) for an in-toto statement."""
        try:
            bundle = self._signer.sign_dsse(Statement(statement))
        except _SERVICE_ERRORS as exc:
            raise self._service_error("sign and log the statement", exc) from None
        text = bundle.to_json()
        doc = jsondoc.loads(text)
        envelope = json.dumps(doc["dsseEnvelope"], separators=(",", ":")).encode()
        return text.encode(), envelope, self._legacy_annotations(doc)

    def vouch(self, payload: bytes, bundle: bytes) -> dict[str, str]:
        """The keyless vouch for ``bundle`` (``formats.ANN_VOUCH_*``): its leaf certificate and a
        signature over ``payload`` by that certificate's ephemeral key (the one that signed the
        bundle; not logged: the bundle's own log entry dates the certificate). Empty if the key
        at hand is not the certificate's (sigstore-python renewed both): the bundle then goes
        unvouched, found within the bounded fallback, as cosign's."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        raw = base64.b64decode(jsondoc.loads(bundle)["verificationMaterial"]["certificate"]["rawBytes"])
        key = ephemeral_key(self._signer)
        leaf_key = x509.load_der_x509_certificate(raw).public_key()
        if leaf_key != key.public_key():
            return {}
        return {
            formats.ANN_VOUCH_CERTIFICATE: base64.b64encode(raw).decode(),
            formats.ANN_VOUCH_SIGNATURE: base64.b64encode(
                key.sign(payload, ec.ECDSA(hashes.SHA256()))
            ).decode(),
        }

    def sign_payload(self, payload: bytes) -> tuple[str, dict[str, str]]:
        """(base64 signature, legacy annotations) over ``payload``."""
        try:
            bundle = self._signer.sign_artifact(payload)
        except _SERVICE_ERRORS as exc:
            raise self._service_error("sign and log the payload", exc) from None
        doc = json.loads(bundle.to_json())
        return doc["messageSignature"]["signature"], self._legacy_annotations(doc)


# -- verification -------------------------------------------------------------------------


class _RulesPolicy:
    """sigstore VerificationPolicy: the certificate matches one of the policy's identities."""

    def __init__(self, rules: Sequence[Identity]) -> None:
        self._rules = list(rules)

    def verify(self, cert: x509.Certificate) -> None:
        if not self._rules or not any(
            r.matches(certs.issuer(cert), certs.subjects(cert)) for r in self._rules
        ):
            raise VerificationError(f"certificate identity {certs.describe(cert)} is not trusted")


def _proto3_defaults(data: bytes) -> bytes:
    """Fill the zero values protobuf JSON may omit (sigstore-go omits ``logIndex: 0`` and empty
    ``hashes`` in an inclusion proof) and sigstore-python's models require."""
    try:
        doc = jsondoc.loads(data)
        entries = doc["verificationMaterial"]["tlogEntries"]
    except (ValueError, KeyError, TypeError):
        return data  # let the real parser report what is wrong
    if not isinstance(entries, list):
        return data
    for entry in entries:
        if isinstance(entry, dict):
            entry.setdefault("logIndex", "0")
            proof = entry.get("inclusionProof")
            if isinstance(proof, dict):
                proof.setdefault("logIndex", "0")
                proof.setdefault("hashes", [])
    return json.dumps(doc).encode()


def verify_bundle(
    data: bytes, rules: Sequence[Identity], trusted_root: str, *, source: str
) -> tuple[str, str, bytes]:
    """(signer, payload type, payload) of a keyless DSSE bundle that satisfies ``rules``."""
    try:
        # sigstore's models parse the bundle again, at whatever depth it nests.
        jsondoc.refuse_deep(data)
        bundle = Bundle.from_json(_proto3_defaults(data))
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


# -- the vouch on a keyless bundle referrer (kernelbake.signing.discover) -------------------

# A Fulcio leaf certificate is 0.7-1 KiB DER (the mock's ~0.6 KiB); base64 of a larger one is not
# decoded. A DER P-256 signature is at most 72 bytes, 96 in base64.
MAX_VOUCH_CERTIFICATE = 8 << 10
MAX_VOUCH_SIGNATURE = 128


class VouchChecker:
    """Checks keyless vouches for one verification: the certificate names an identity ``rules``
    trust, chains to the trusted root's Fulcio CA (at its own notBefore: the vouch only picks
    which bundles are read first; the bundle is then verified in full, log entry included) and
    is for code signing, and its key signed ``payload``. The certificate part is done once per
    distinct certificate (cached here), the signature once per claim (cached by the caller)."""

    def __init__(self, rules: Sequence[Identity], trusted_root: str) -> None:
        self._rules = list(rules)
        self._trusted_root = trusted_root
        self._certs: dict[str, x509.Certificate | bool | None] = {}

    def check(self, certificate: str, signature: str, payload: bytes) -> bool | None:
        """True: a trusted identity vouches; False: junk (the certificate is not one, or the
        trusted CA's certificate for a trusted identity did not sign this vouch: copied or
        forged); None: no vouch this policy can use (another identity, or a certificate the
        trusted root does not vouch for, say signed against Sigstore staging): an ordinary
        candidate, whose bundle then says why it does not verify."""
        from cryptography.exceptions import InvalidSignature as CryptoInvalid
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        if certificate not in self._certs:
            self._certs[certificate] = self._leaf(certificate)
        leaf = self._certs[certificate]
        if not isinstance(leaf, x509.Certificate):
            return leaf
        if len(signature) > MAX_VOUCH_SIGNATURE:
            return False
        try:
            raw = base64.b64decode(signature, validate=True)
            key = leaf.public_key()
            if not isinstance(key, ec.EllipticCurvePublicKey):
                return False
            key.verify(raw, payload, ec.ECDSA(hashes.SHA256()))
        except (CryptoInvalid, binascii.Error, ValueError):
            return False
        return True

    def _leaf(self, certificate: str) -> x509.Certificate | bool | None:
        """The certificate if the trusted CA issued it for a trusted identity; else as ``check``."""
        from cryptography.x509.oid import ExtendedKeyUsageOID

        if len(certificate) > MAX_VOUCH_CERTIFICATE:
            return False
        try:
            leaf = x509.load_der_x509_certificate(base64.b64decode(certificate, validate=True))
            if not any(r.matches(certs.issuer(leaf), certs.subjects(leaf)) for r in self._rules):
                return None
        except (ValueError, binascii.Error):
            return False
        try:
            usage = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except (ValueError, x509.ExtensionNotFound):
            return None
        if ExtendedKeyUsageOID.CODE_SIGNING not in usage:
            return None
        try:
            roots = _root(self._trusted_root)[0].get_fulcio_certs()
        except TrustRootUnavailable:
            return None  # not checkable here; the bundle, if read, says why
        when = leaf.not_valid_before_utc.timestamp()
        try:
            _verify_chain(leaf, [], roots, when, source="vouch")
        except (UntrustedSigner, ValueError):
            return None
        return leaf


# -- legacy (cosign 2) keyless: certificate, chain and Rekor SET in layer annotations -------


def _legacy_material(
    annotations: Mapping[str, str], *, source: str
) -> tuple[x509.Certificate, list[x509.Certificate], dict[str, Any], bytes]:
    """(leaf, chain, Rekor payload, SET) from a legacy layer's annotations."""
    try:
        leaf = x509.load_pem_x509_certificate(annotations[formats.ANN_CERTIFICATE].encode())
        chain_pem = annotations.get(formats.ANN_CHAIN, "")
        chain = x509.load_pem_x509_certificates(chain_pem.encode()) if chain_pem.strip() else []
    except (KeyError, ValueError):
        raise MalformedSignature(f"{source}: certificate annotations are not PEM certificates") from None
    raw = annotations.get(formats.ANN_REKOR_BUNDLE)
    if not raw:
        raise MalformedSignature(f"{source}: keyless signature without a Rekor bundle annotation")
    try:
        doc = jsondoc.loads(raw)
        payload, entry_set = doc["Payload"], base64.b64decode(doc["SignedEntryTimestamp"], validate=True)
        for name, kind in (("body", str), ("integratedTime", int), ("logIndex", int), ("logID", str)):
            if not isinstance(payload[name], kind):
                raise TypeError(name)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise MalformedSignature(f"{source}: Rekor bundle annotation is malformed") from None
    return leaf, chain, payload, entry_set


def _verify_chain(
    leaf: x509.Certificate,
    chain: Sequence[x509.Certificate],
    roots: list[x509.Certificate],
    when: float,
    *,
    source: str,
) -> list[x509.Certificate]:
    from cryptography.x509 import ExtendedKeyUsage
    from cryptography.x509.verification import Criticality, ExtensionPolicy, PolicyBuilder, Store
    from cryptography.x509.verification import VerificationError as X509Error

    # Fulcio certificates are code-signing, not client-auth: allow any EKU here, check it below.
    ca = ExtensionPolicy.webpki_defaults_ca().may_be_present(ExtendedKeyUsage, Criticality.NON_CRITICAL, None)
    ee = ExtensionPolicy.webpki_defaults_ee().may_be_present(ExtendedKeyUsage, Criticality.NON_CRITICAL, None)
    verifier = (
        PolicyBuilder()
        .store(Store(roots))
        .time(dt.datetime.fromtimestamp(when, dt.UTC))
        .extension_policies(ca_policy=ca, ee_policy=ee)
        .build_client_verifier()
    )
    try:
        return verifier.verify(leaf, [c for c in chain if c not in roots]).chain[1:]
    except (X509Error, x509.UnsupportedGeneralNameType) as exc:
        raise UntrustedSigner(
            f"{source}: certificate for {certs.describe(leaf)} does not chain to the trusted root ({exc})"
        ) from None


def verify_legacy(
    annotations: Mapping[str, str],
    rules: Sequence[Identity],
    trusted_root: str,
    *,
    signed: bytes,
    signature: bytes,
    entry_matches: Callable[[dict[str, Any], x509.Certificate], bool],
    source: str,
) -> str:
    """Verify a cosign 2 keyless signature: ``signature`` over ``signed`` by the certificate in
    the annotations, the certificate chained to the Fulcio root at the Rekor integrated time,
    its SCT, the Rekor SET, and a log entry body that matches. Returns the signer."""
    from cryptography.exceptions import InvalidSignature as CryptoInvalid
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    from kernelbake.signing._internal.sigstore_private import KeyID, KeyringPurpose, verify_sct

    leaf, chain, payload, entry_set = _legacy_material(annotations, source=source)
    if not any(r.matches(certs.issuer(leaf), certs.subjects(leaf)) for r in rules):
        trusted = "; ".join(str(r) for r in rules) or "no identities"
        raise UntrustedSigner(f"{source}: signed by {certs.describe(leaf)}; the policy trusts {trusted}")
    root = _root(trusted_root)[0]
    path = _verify_chain(leaf, chain, root.get_fulcio_certs(), payload["integratedTime"], source=source)
    try:
        verify_sct(leaf, path, root.ct_keyring(KeyringPurpose.VERIFY))
        usage = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        if ExtendedKeyUsageOID.CODE_SIGNING not in usage:
            raise VerificationError("certificate is not for code signing")
        canonical = json.dumps(
            {k: payload[k] for k in ("body", "integratedTime", "logID", "logIndex")},
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
        root.rekor_keyring(KeyringPurpose.VERIFY).verify(
            key_id=KeyID(bytes.fromhex(payload["logID"])), signature=entry_set, data=canonical
        )
    except (VerificationError, Error, ValueError, x509.ExtensionNotFound) as exc:
        raise InvalidSignature(
            f"{source}: keyless signature does not verify: {str(exc).splitlines()[0]}"
        ) from None
    key = leaf.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise InvalidSignature(f"{source}: certificate key is not ECDSA")
    try:
        key.verify(signature, signed, ec.ECDSA(hashes.SHA256()))
    except CryptoInvalid:
        raise InvalidSignature(
            f"{source}: signature does not verify with {certs.describe(leaf)}'s certificate"
        ) from None
    try:
        body = jsondoc.loads(base64.b64decode(payload["body"]))
    except (ValueError, binascii.Error):
        raise InvalidSignature(f"{source}: Rekor entry body is not JSON") from None
    if not entry_matches(body, leaf):
        raise InvalidSignature(f"{source}: the Rekor entry does not record this signature")
    return certs.describe(leaf)


def _same_cert(b64_pem: Any, cert: x509.Certificate) -> bool:
    try:
        return x509.load_pem_x509_certificate(base64.b64decode(b64_pem)) == cert
    except (ValueError, TypeError, binascii.Error):
        return False


def hashedrekord_matches(
    payload: bytes, signature: bytes
) -> Callable[[dict[str, Any], x509.Certificate], bool]:
    """The log entry of a legacy .sig: hashedrekord of sha256(payload), this signature and cert."""

    def check(body: dict[str, Any], cert: x509.Certificate) -> bool:
        try:
            spec = body["spec"]
            return bool(
                body["kind"] == "hashedrekord"
                and spec["data"]["hash"]
                == {"algorithm": "sha256", "value": hashlib.sha256(payload).hexdigest()}
                and base64.b64decode(spec["signature"]["content"]) == signature
                and _same_cert(spec["signature"]["publicKey"]["content"], cert)
            )
        except (KeyError, TypeError, ValueError, binascii.Error):
            return False

    return check


def dsse_matches(
    payload: bytes, signatures: Sequence[bytes]
) -> Callable[[dict[str, Any], x509.Certificate], bool]:
    """The log entry of a legacy .att: dsse with sha256(payload) and these signatures by cert."""

    def check(body: dict[str, Any], cert: x509.Certificate) -> bool:
        try:
            spec = body["spec"]
            logged = {
                base64.b64decode(s["signature"])
                for s in spec["signatures"]
                if _same_cert(s["verifier"], cert)
            }
            return bool(
                body["kind"] == "dsse"
                and spec["payloadHash"]
                == {"algorithm": "sha256", "value": hashlib.sha256(payload).hexdigest()}
                and logged
                and logged <= set(signatures)
            )
        except (KeyError, TypeError, ValueError, binascii.Error):
            return False

    return check
