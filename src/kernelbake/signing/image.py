"""What a signer or verifier reads from a pushed image: its manifest (through an index, if any),
its config labels, and the cache manifest held by its last layer."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import tarfile
import zlib
from collections.abc import Mapping

from kernelbake.errors import BadInput
from kernelbake.oci import Descriptor, Manifest, Reference, RegistryClient
from kernelbake.oci import types as mt

# Where the cache manifest lives in every kernelbake image, and the only file its last layer holds.
CACHE_MANIFEST_PATH = "opt/kernelbake/cache/manifest.json"
MAX_CONFIG_BYTES = 8 << 20
MAX_CACHE_LAYER_BYTES = 64 << 20
MAX_CACHE_MANIFEST_BYTES = 256 << 20
_LAYER_TYPES = (mt.OCI_LAYER_GZIP, mt.DOCKER_LAYER_GZIP, mt.OCI_LAYER_TAR)


class ImageLayoutError(BadInput):
    """The image is not shaped like a kernelbake image (no single platform, bad last layer)."""


@dataclasses.dataclass(frozen=True)
class ImageFacts:
    ref: Reference  # pinned: .digest is the digest that was resolved (index or manifest)
    top: Manifest  # what the digest names (an image manifest, or an index)
    manifest: Manifest  # the image manifest (== top unless top is an index)
    labels: Mapping[str, str]

    @property
    def last_layer(self) -> Descriptor | None:
        layers = self.manifest.layers
        return layers[-1] if layers else None


def _is_attestation_entry(d: Descriptor) -> bool:
    # buildx adds in-toto attestation manifests to indexes, marked as platform unknown/unknown.
    platform = d.platform or {}
    return d.annotations.get("vnd.docker.reference.type") == "attestation-manifest" or (
        platform.get("os"),
        platform.get("architecture"),
    ) == ("unknown", "unknown")


def image_manifest(client: RegistryClient, ref: Reference, top: Manifest) -> Manifest:
    """The one image manifest behind ``top``: itself, or the single real entry of an index."""
    if not top.is_index:
        if top.media_type not in mt.IMAGE_MANIFESTS:
            raise ImageLayoutError(f"{ref.pinned()}: {top.media_type} is not an image manifest")
        return top
    entries = [
        d for d in top.manifests if d.media_type in mt.IMAGE_MANIFESTS and not _is_attestation_entry(d)
    ]
    if len(entries) != 1:
        raise ImageLayoutError(
            f"{ref.pinned()}: index lists {len(entries)} images; kernelbake images are single-platform"
        )
    child = client.get_manifest(ref.with_digest(entries[0].digest), accept=mt.IMAGE_MANIFESTS)
    return child


def read_labels(client: RegistryClient, ref: Reference, manifest: Manifest) -> dict[str, str]:
    config = manifest.config
    data = client.get_blob(ref, config.digest, max_bytes=MAX_CONFIG_BYTES)
    try:
        doc = json.loads(data)
        labels = (doc.get("config") or {}).get("Labels") or {}
    except (ValueError, AttributeError):
        raise ImageLayoutError(f"{ref.pinned()}: image config {config.digest} is not JSON") from None
    if not isinstance(labels, dict):
        raise ImageLayoutError(f"{ref.pinned()}: image config labels are not a mapping")
    return {str(k): str(v) for k, v in labels.items()}


def read_image(client: RegistryClient, ref: Reference, top: Manifest) -> ImageFacts:
    """``ref`` must be pinned to ``top.digest``."""
    manifest = image_manifest(client, ref, top)
    return ImageFacts(ref, top, manifest, read_labels(client, ref, manifest))


def read_cache_manifest(client: RegistryClient, facts: ImageFacts) -> tuple[Descriptor, bytes]:
    """The last layer's descriptor and the exact bytes of the cache manifest it holds.

    The layer must hold that one file (directories aside): anything else in the last layer
    would be bytes the attestation does not describe.
    """
    where = facts.ref.pinned()
    layer = facts.last_layer
    if layer is None:
        raise ImageLayoutError(f"{where}: image has no layers, so no cache manifest")
    if layer.media_type not in _LAYER_TYPES:
        raise ImageLayoutError(f"{where}: last layer is {layer.media_type}; expected a tar or tar+gzip layer")
    blob = client.get_blob(facts.ref, layer.digest, max_bytes=MAX_CACHE_LAYER_BYTES)
    try:
        raw = gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob
        found: bytes | None = None
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for member in tar:
                name = member.name.removeprefix("./").rstrip("/")
                if member.isdir():
                    continue
                if name != CACHE_MANIFEST_PATH or not member.isreg() or found is not None:
                    raise ImageLayoutError(
                        f"{where}: last layer {layer.digest} holds {name!r}; it must hold only {CACHE_MANIFEST_PATH}"
                    )
                if member.size > MAX_CACHE_MANIFEST_BYTES:
                    raise ImageLayoutError(
                        f"{where}: {CACHE_MANIFEST_PATH} is {member.size} bytes, too large"
                    )
                fh = tar.extractfile(member)
                found = fh.read() if fh else b""
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise ImageLayoutError(f"{where}: last layer {layer.digest} is not a readable tar ({exc})") from None
    if found is None:
        raise ImageLayoutError(f"{where}: last layer {layer.digest} does not hold {CACHE_MANIFEST_PATH}")
    return layer, found
