"""Does one signature artifact verify under the policy? Returns what it signed, or raises why not.

Classification, used to report the most telling reason when nothing verifies:
* ``UntrustedSigner``: the artifact names a signer (key hint, certificate) the policy does not trust,
  or no trusted key verifies a hint-less signature;
* ``InvalidSignature``: it names a trusted signer but does not verify (corrupted or tampered);
* ``MalformedSignature``: it cannot be parsed.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Mapping
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.signing import formats
from kernelbake.signing.errors import InvalidSignature, MalformedSignature, UntrustedSigner
from kernelbake.signing.intoto import PAYLOAD_TYPE, Envelope, parse_envelope, parse_envelope_bytes
from kernelbake.signing.keys import PublicKey
from kernelbake.signing.policy import VerifyPolicy


@dataclasses.dataclass(frozen=True)
class Verified:
    signer: str
    payload_type: str
    payload: bytes


def _trusted_keys(policy: VerifyPolicy) -> str:
    return ", ".join(k.fingerprint for k in policy.keys) or "no keys"


def _verify_envelope(envelope: Envelope, keys: tuple[PublicKey, ...]) -> PublicKey | None:
    data = envelope.pae()
    for key in keys:
        if any(key.verifies(sig, data) for sig in envelope.signatures):
            return key
    return None


def _key_candidates(policy: VerifyPolicy, hint: str | None, *, source: str) -> tuple[PublicKey, ...]:
    if not hint:
        return policy.keys
    named = tuple(k for k in policy.keys if k.hint == hint)
    if not named:
        try:
            shown = "sha256:" + base64.b64decode(hint).hex()
        except (binascii.Error, ValueError):
            shown = repr(hint)
        raise UntrustedSigner(f"{source}: signed by key {shown}; the policy trusts {_trusted_keys(policy)}")
    return named


def verify_bundle(data: bytes, policy: VerifyPolicy, *, source: str) -> Verified:
    """A Sigstore bundle holding a DSSE envelope, key-based or keyless."""
    try:
        doc: Any = jsondoc.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise MalformedSignature(f"{source}: bundle is not JSON") from None
    if not isinstance(doc, dict) or doc.get("mediaType") not in formats.BUNDLE_MEDIA_TYPES:
        media = doc.get("mediaType") if isinstance(doc, dict) else None
        raise MalformedSignature(f"{source}: not a Sigstore bundle (mediaType {media!r})")
    material = doc.get("verificationMaterial")
    if not isinstance(material, dict):
        raise MalformedSignature(f"{source}: bundle has no verificationMaterial")
    if "dsseEnvelope" not in doc:
        raise MalformedSignature(
            f"{source}: bundle holds no DSSE envelope (a blob signature is not an image signature)"
        )
    if "publicKey" in material:
        hint_doc = material.get("publicKey")
        hint = hint_doc.get("hint") if isinstance(hint_doc, dict) else None
        envelope = parse_envelope(doc["dsseEnvelope"], source=source)
        if not policy.keys:
            raise UntrustedSigner(f"{source}: signed with a key; the policy trusts only keyless identities")
        candidates = _key_candidates(policy, hint if isinstance(hint, str) else None, source=source)
        key = _verify_envelope(envelope, candidates)
        if key is None:
            if hint:
                raise InvalidSignature(
                    f"{source}: signature by trusted key {candidates[0].fingerprint} does not verify"
                )
            raise UntrustedSigner(
                f"{source}: no trusted key ({_trusted_keys(policy)}) verifies the signature"
            )
        return Verified(f"key {key.fingerprint}", envelope.payload_type, envelope.payload)
    if "certificate" in material or "x509CertificateChain" in material:
        root = _keyless_policy(policy, source=source)
        from kernelbake.signing._internal import keyless

        signer, payload_type, payload = keyless.verify_bundle(data, policy.identities, root, source=source)
        return Verified(signer, payload_type, payload)
    raise MalformedSignature(f"{source}: bundle has neither a public key hint nor a certificate")


def _keyless_policy(policy: VerifyPolicy, *, source: str) -> str:
    if not policy.identities or policy.trusted_root is None:
        raise UntrustedSigner(f"{source}: keyless signature; the policy trusts only keys")
    return policy.trusted_root


def verify_legacy_signature(
    payload: bytes, annotations: Mapping[str, str], policy: VerifyPolicy, *, source: str
) -> Verified:
    """One layer of a ``.sig`` image: the simple-signing payload and its signature annotation."""
    raw = annotations.get(formats.ANN_SIGNATURE)
    if not raw:
        raise MalformedSignature(f"{source}: layer has no {formats.ANN_SIGNATURE} annotation")
    try:
        signature = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedSignature(f"{source}: signature annotation is not base64") from None
    if formats.ANN_CERTIFICATE in annotations:
        from kernelbake.signing._internal import keyless

        signer = keyless.verify_legacy(
            annotations,
            policy.identities,
            _keyless_policy(policy, source=source),
            signed=payload,
            signature=signature,
            entry_matches=keyless.hashedrekord_matches(payload, signature),
            source=source,
        )
        return Verified(signer, formats.SIMPLE_SIGNING, payload)
    for key in policy.keys:
        if key.verifies(signature, payload):
            return Verified(f"key {key.fingerprint}", formats.SIMPLE_SIGNING, payload)
    raise UntrustedSigner(f"{source}: no trusted key ({_trusted_keys(policy)}) verifies the signature")


def verify_legacy_attestation(
    data: bytes, annotations: Mapping[str, str], policy: VerifyPolicy, *, source: str
) -> Verified:
    """One layer of a ``.att`` image: a DSSE envelope."""
    envelope = parse_envelope_bytes(data, source=source)
    if envelope.payload_type != PAYLOAD_TYPE:
        raise MalformedSignature(f"{source}: DSSE payloadType {envelope.payload_type!r} is not in-toto")
    if formats.ANN_CERTIFICATE in annotations:
        from kernelbake.signing._internal import keyless

        signer = keyless.verify_legacy(
            annotations,
            policy.identities,
            _keyless_policy(policy, source=source),
            signed=envelope.pae(),
            signature=envelope.signatures[0],
            entry_matches=keyless.dsse_matches(envelope.payload, envelope.signatures),
            source=source,
        )
        return Verified(signer, envelope.payload_type, envelope.payload)
    key = _verify_envelope(envelope, policy.keys)
    if key is None:
        raise UntrustedSigner(f"{source}: no trusted key ({_trusted_keys(policy)}) verifies the attestation")
    return Verified(f"key {key.fingerprint}", envelope.payload_type, envelope.payload)
