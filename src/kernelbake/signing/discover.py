"""Find every signature artifact attached to a digest, in both formats."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from kernelbake.oci import Reference, RegistryClient, RegistryNotFound
from kernelbake.oci import types as mt
from kernelbake.signing import formats

MAX_REFERRERS = 64
MAX_ARTIFACT_BYTES = 4 << 20


class Kind(enum.Enum):
    BUNDLE = "bundle"
    LEGACY_SIGNATURE = "legacy-signature"
    LEGACY_ATTESTATION = "legacy-attestation"


@dataclasses.dataclass(frozen=True)
class Artifact:
    kind: Kind
    origin: str  # where it was found, for messages
    data: bytes
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _bundles(client: RegistryClient, ref: Reference) -> list[Artifact]:
    out = []
    for desc in client.referrers(ref)[:MAX_REFERRERS]:
        if desc.media_type != mt.OCI_MANIFEST:
            continue
        try:
            manifest = client.get_manifest(ref.with_digest(desc.digest), accept=(mt.OCI_MANIFEST,))
        except RegistryNotFound:
            continue  # a stale entry in the fallback index
        if manifest.artifact_type not in formats.BUNDLE_MEDIA_TYPES:
            continue
        for layer in manifest.layers:
            if layer.media_type in formats.BUNDLE_MEDIA_TYPES:
                data = client.get_blob(ref, layer.digest, max_bytes=MAX_ARTIFACT_BYTES)
                out.append(Artifact(Kind.BUNDLE, f"{ref.name}@{desc.digest} (bundle)", data))
    return out


def _legacy(
    client: RegistryClient, ref: Reference, suffix: str, kind: Kind, media_type: str
) -> list[Artifact]:
    assert ref.digest is not None
    tag = formats.legacy_tag(ref.digest, suffix)
    try:
        manifest = client.get_manifest(ref.with_tag(tag), accept=mt.IMAGE_MANIFESTS)
    except RegistryNotFound:
        return []
    out = []
    for i, layer in enumerate(manifest.layers[:MAX_REFERRERS]):
        if layer.media_type == media_type:
            data = client.get_blob(ref, layer.digest, max_bytes=MAX_ARTIFACT_BYTES)
            out.append(Artifact(kind, f"{ref.name}:{tag} layer {i}", data, layer.annotations))
    return out


def find_artifacts(client: RegistryClient, ref: Reference) -> list[Artifact]:
    """Bundles (referrers API or fallback tag) and legacy ``.sig``/``.att`` layers of ``ref.digest``."""
    return [
        *_bundles(client, ref),
        *_legacy(client, ref, formats.SIG_SUFFIX, Kind.LEGACY_SIGNATURE, formats.SIMPLE_SIGNING),
        *_legacy(client, ref, formats.ATT_SUFFIX, Kind.LEGACY_ATTESTATION, formats.DSSE_ENVELOPE),
    ]
