"""In-toto statements in DSSE envelopes, and cosign's legacy "simple signing" payload.

Everything here is pure bytes-in/values-out; parsing failures raise ``MalformedSignature``
naming where the bytes came from.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.oci.reference import is_digest
from kernelbake.signing.errors import MalformedSignature

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_V1 = "https://in-toto.io/Statement/v1"
STATEMENT_V01 = "https://in-toto.io/Statement/v0.1"  # what `cosign attest` still writes
STATEMENT_TYPES = (STATEMENT_V1, STATEMENT_V01)
# cosign's predicate type for an image signature carried in a bundle.
COSIGN_SIGN_PREDICATE = "https://sigstore.dev/cosign/sign/v1"
SIMPLE_SIGNING_TYPE = "cosign container image signature"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what is actually signed."""
    t = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(t), t, len(payload), payload)


def _b64decode(value: Any, *, what: str, source: str) -> bytes:
    if not isinstance(value, str):
        raise MalformedSignature(f"{source}: {what} is not a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedSignature(f"{source}: {what} is not valid base64") from None


def _json_object(data: bytes, *, what: str, source: str) -> dict[str, Any]:
    try:
        doc = jsondoc.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise MalformedSignature(f"{source}: {what} is not JSON") from None
    if not isinstance(doc, dict):
        raise MalformedSignature(f"{source}: {what} is not a JSON object")
    return doc


# -- statements ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Statement:
    predicate_type: str
    # (name, "sha256:<hex>") per subject; name may be "".
    subjects: tuple[tuple[str, str], ...]
    predicate: Mapping[str, Any]

    def covers(self, digest: str) -> bool:
        return any(d == digest for _, d in self.subjects)

    def digests(self) -> list[str]:
        return [d for _, d in self.subjects]


def make_statement(name: str, digest: str, predicate_type: str, predicate: Mapping[str, Any]) -> bytes:
    """An in-toto v1 statement about one image digest, as compact JSON bytes."""
    doc = {
        "_type": STATEMENT_V1,
        "subject": [{"name": name, "digest": {"sha256": digest.removeprefix("sha256:")}}],
        "predicateType": predicate_type,
        "predicate": dict(predicate),
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def parse_statement(payload: bytes, *, source: str) -> Statement:
    doc = _json_object(payload, what="in-toto statement", source=source)
    if doc.get("_type") not in STATEMENT_TYPES:
        raise MalformedSignature(f"{source}: statement _type {doc.get('_type')!r} is not in-toto")
    predicate_type = doc.get("predicateType")
    if not isinstance(predicate_type, str) or not predicate_type:
        raise MalformedSignature(f"{source}: statement has no predicateType")
    raw_subjects = doc.get("subject")
    if not isinstance(raw_subjects, list) or not raw_subjects:
        raise MalformedSignature(f"{source}: statement has no subject")
    subjects = []
    for s in raw_subjects:
        digests = s.get("digest") if isinstance(s, dict) else None
        hex_ = digests.get("sha256") if isinstance(digests, dict) else None
        if isinstance(hex_, str) and is_digest(f"sha256:{hex_}"):
            name = s.get("name")
            subjects.append((name if isinstance(name, str) else "", f"sha256:{hex_}"))
    predicate = doc.get("predicate", {})
    if predicate is None:
        predicate = {}
    if not isinstance(predicate, dict):
        raise MalformedSignature(f"{source}: statement predicate is not an object")
    return Statement(predicate_type, tuple(subjects), predicate)


# -- DSSE envelopes -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Envelope:
    payload_type: str
    payload: bytes
    signatures: tuple[bytes, ...]

    def pae(self) -> bytes:
        return pae(self.payload_type, self.payload)

    def to_json(self) -> dict[str, Any]:
        return {
            "payload": base64.b64encode(self.payload).decode(),
            "payloadType": self.payload_type,
            "signatures": [{"sig": base64.b64encode(s).decode()} for s in self.signatures],
        }


def parse_envelope(doc: Any, *, source: str) -> Envelope:
    if not isinstance(doc, dict):
        raise MalformedSignature(f"{source}: DSSE envelope is not an object")
    payload_type = doc.get("payloadType")
    if not isinstance(payload_type, str):
        raise MalformedSignature(f"{source}: DSSE envelope has no payloadType")
    payload = _b64decode(doc.get("payload"), what="DSSE payload", source=source)
    sigs = doc.get("signatures")
    if not isinstance(sigs, list) or not sigs:
        raise MalformedSignature(f"{source}: DSSE envelope has no signatures")
    signatures = tuple(
        _b64decode(s.get("sig") if isinstance(s, dict) else None, what="DSSE signature", source=source)
        for s in sigs
    )
    return Envelope(payload_type, payload, signatures)


def parse_envelope_bytes(data: bytes, *, source: str) -> Envelope:
    return parse_envelope(_json_object(data, what="DSSE envelope", source=source), source=source)


# -- cosign simple signing (legacy .sig) --------------------------------------------------


def simple_signing_payload(name: str, digest: str) -> bytes:
    doc = {
        "critical": {
            "identity": {"docker-reference": name},
            "image": {"docker-manifest-digest": digest},
            "type": SIMPLE_SIGNING_TYPE,
        },
        "optional": None,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def parse_simple_signing(payload: bytes, *, source: str) -> str:
    """The digest a simple-signing payload vouches for."""
    doc = _json_object(payload, what="simple signing payload", source=source)
    critical = doc.get("critical")
    if not isinstance(critical, dict) or critical.get("type") != SIMPLE_SIGNING_TYPE:
        raise MalformedSignature(f"{source}: not a cosign simple signing payload")
    image = critical.get("image")
    digest = image.get("docker-manifest-digest") if isinstance(image, dict) else None
    if not isinstance(digest, str) or not is_digest(digest):
        raise MalformedSignature(f"{source}: simple signing payload names no sha256 digest")
    return digest
