"""Signers: something that turns an in-toto statement into a Sigstore bundle, and a payload into
a legacy cosign signature. ``KeySigner`` signs with a local ECDSA P-256 key (no transparency
log, a public-key hint in the bundle); ``kernelbake.signing._internal.keyless.KeylessSigner``
signs with a Fulcio certificate and a Rekor entry through sigstore-python."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Mapping
from typing import Protocol

from kernelbake.signing.formats import BUNDLE_V03
from kernelbake.signing.intoto import PAYLOAD_TYPE, Envelope
from kernelbake.signing.keys import PrivateKey


@dataclasses.dataclass(frozen=True)
class SignedStatement:
    bundle: bytes  # Sigstore bundle JSON (DSSE envelope + verification material)
    envelope: bytes  # the DSSE envelope alone, for the legacy .att layer
    # Legacy-format annotations carrying the verification material (keyless: cert, chain, SET).
    legacy_annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LegacySignature:
    signature: str  # base64 of the signature over the payload bytes
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)


class Signer(Protocol):
    @property
    def identity(self) -> str: ...

    def sign_statement(self, statement: bytes) -> SignedStatement: ...

    def sign_payload(self, payload: bytes) -> LegacySignature: ...


def _json(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


class KeySigner:
    """Key-based signing for air-gapped builders: nothing leaves the machine."""

    def __init__(self, key: PrivateKey) -> None:
        self._key = key

    @property
    def identity(self) -> str:
        return f"key {self._key.public.fingerprint}"

    def sign_statement(self, statement: bytes) -> SignedStatement:
        envelope = Envelope(PAYLOAD_TYPE, statement, ())
        envelope = dataclasses.replace(envelope, signatures=(self._key.sign(envelope.pae()),))
        env_doc = envelope.to_json()
        bundle = {
            "mediaType": BUNDLE_V03,
            "verificationMaterial": {"publicKey": {"hint": self._key.public.hint}},
            "dsseEnvelope": env_doc,
        }
        return SignedStatement(bundle=_json(bundle), envelope=_json(env_doc))

    def sign_payload(self, payload: bytes) -> LegacySignature:
        return LegacySignature(base64.b64encode(self._key.sign(payload)).decode())
