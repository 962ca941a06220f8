"""How signatures sit in a registry, byte-compatible with cosign.

* Bundle format (cosign ``--new-bundle-format``, the default): one OCI manifest per signature
  or attestation, ``artifactType`` = the Sigstore bundle media type, the bundle as its only
  layer, ``subject`` = the signed image; found through the referrers API or the fallback tag.
* Legacy format (cosign 2 default): tag ``sha256-<hex>.sig`` holds one layer per signature (a
  simple-signing payload, the signature in an annotation); tag ``sha256-<hex>.att`` holds one
  layer per attestation (a DSSE envelope).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from kernelbake.oci import types as mt
from kernelbake.oci.reference import check_digest
from kernelbake.oci.types import Descriptor, encode_json

BUNDLE_V03 = "application/vnd.dev.sigstore.bundle.v0.3+json"
BUNDLE_MEDIA_TYPES = (
    BUNDLE_V03,
    "application/vnd.dev.sigstore.bundle+json;version=0.3",
    "application/vnd.dev.sigstore.bundle+json;version=0.2",
    "application/vnd.dev.sigstore.bundle+json;version=0.1",
)
ANN_BUNDLE_CONTENT = "dev.sigstore.bundle.content"
ANN_BUNDLE_PREDICATE = "dev.sigstore.bundle.predicateType"
ANN_CREATED = "org.opencontainers.image.created"
# kernelbake's vouch for a bundle referrer, readable from the referrers listing alone: the bundle
# layer's digest, who signed (a key's hint, or for keyless the Fulcio leaf certificate, base64
# DER), and a signature by that key (keyless: the certificate's ephemeral key) over both digests
# (``vouch_payload``). A verifier that trusts the key or the certificate's identity finds its
# bundles among any number of look-alikes without fetching them; cosign and others ignore these.
ANN_VOUCH_LAYER = "dev.kernelbake.bundle.layer"
ANN_VOUCH_KEY = "dev.kernelbake.bundle.key"
ANN_VOUCH_CERTIFICATE = "dev.kernelbake.bundle.certificate"
ANN_VOUCH_SIGNATURE = "dev.kernelbake.bundle.signature"

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE_ENVELOPE = "application/vnd.dsse.envelope.v1+json"
ANN_SIGNATURE = "dev.cosignproject.cosign/signature"
ANN_CERTIFICATE = "dev.sigstore.cosign/certificate"
ANN_CHAIN = "dev.sigstore.cosign/chain"
ANN_REKOR_BUNDLE = "dev.sigstore.cosign/bundle"
ANN_PREDICATE_TYPE = "predicateType"

SIG_SUFFIX = ".sig"
ATT_SUFFIX = ".att"


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def legacy_tag(digest: str, suffix: str) -> str:
    return check_digest(digest).replace(":", "-") + suffix


def vouch_payload(subject_digest: str, layer_digest: str) -> bytes:
    """What a vouch signs: this bundle layer, for this subject (never another image's)."""
    return f"kernelbake-bundle-vouch-v1 {subject_digest} {layer_digest}".encode()


def bundle_referrer(
    subject: Descriptor,
    bundle: bytes,
    predicate_type: str,
    *,
    created: str,
    vouch: Mapping[str, str] | None = None,
) -> tuple[bytes, bytes]:
    """(manifest bytes, bundle bytes) of one bundle referrer, laid out as cosign 3 writes it;
    ``vouch``: the ``ANN_VOUCH_*`` annotations."""
    layer = Descriptor.of(bundle, BUNDLE_V03)
    empty = Descriptor.of(mt.EMPTY_JSON, mt.OCI_EMPTY)
    doc = {
        "schemaVersion": 2,
        "mediaType": mt.OCI_MANIFEST,
        "artifactType": BUNDLE_V03,
        "config": empty.to_json(),
        "layers": [layer.to_json()],
        "subject": Descriptor(
            media_type=subject.media_type, digest=subject.digest, size=subject.size
        ).to_json(),
        "annotations": {
            ANN_BUNDLE_CONTENT: "dsse-envelope",
            ANN_BUNDLE_PREDICATE: predicate_type,
            ANN_CREATED: created,
            **(vouch or {}),
        },
    }
    return encode_json(doc), bundle


def legacy_layer(data: bytes, media_type: str, annotations: Mapping[str, str]) -> Descriptor:
    return Descriptor.of(data, media_type, annotations=annotations)


def legacy_manifest(layers: Sequence[Descriptor]) -> tuple[bytes, bytes]:
    """(manifest bytes, config bytes) of a ``.sig``/``.att`` image, with cosign's config shape."""
    config = encode_json(
        {
            "architecture": "",
            "created": "0001-01-01T00:00:00Z",
            "history": [{"created": "0001-01-01T00:00:00Z"}],
            "os": "",
            "rootfs": {"type": "layers", "diff_ids": [d.digest for d in layers]},
            "config": {},
        }
    )
    doc = {
        "schemaVersion": 2,
        "mediaType": mt.OCI_MANIFEST,
        "config": Descriptor.of(config, mt.OCI_CONFIG).to_json(),
        "layers": [d.to_json() for d in layers],
    }
    return encode_json(doc), config
