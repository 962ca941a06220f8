"""What kernelbake reads from a pushed image without pulling it: its manifest (through an index,
if any), its config labels, and the cache manifest held by its last layer.

``inspect``, ``sign`` and ``verify`` all read images here, through ``kernelbake.oci``; like it,
this module is host-only (``requests``), so commands import it inside their functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import tarfile
import zlib
from collections.abc import Iterator, Mapping

from kernelbake.contract import jsondoc
from kernelbake.contract.artifact import cache_manifest_path
from kernelbake.contract.manifest import Manifest as CacheManifest
from kernelbake.errors import BadInput, EnvironmentProblem
from kernelbake.oci import (
    Descriptor,
    Manifest,
    Reference,
    RegistryClient,
    RegistryUnreachable,
    parse_reference,
)
from kernelbake.oci import types as mt

MAX_CONFIG_BYTES = 8 << 20
MAX_CACHE_LAYER_BYTES = 64 << 20
MAX_CACHE_MANIFEST_BYTES = 256 << 20
_LAYER_TYPES = (mt.OCI_LAYER_GZIP, mt.DOCKER_LAYER_GZIP, mt.OCI_LAYER_TAR)


class ImageLayoutError(BadInput):
    """The image is not shaped like a kernelbake image (no single platform, bad last layer)."""


@contextlib.contextmanager
def registry_reachable(registry: str) -> Iterator[None]:
    """A registry that does not answer is a service that is down (exit 3), as Docker is."""
    try:
        yield
    except RegistryUnreachable as exc:
        raise EnvironmentProblem(
            f"registry {registry} is unreachable: {exc}", hint="start it (make registry) or check the address"
        ) from None


@dataclasses.dataclass(frozen=True)
class ImageFacts:
    ref: Reference  # pinned: .digest is the digest that was resolved (index or manifest)
    top: Manifest  # what the digest names (an image manifest, or an index)
    manifest: Manifest  # the image manifest (== top unless top is an index)
    labels: Mapping[str, str]

    @property
    def cache_manifest_path(self) -> str:
        """Where the cache manifest is: under the cache root of an image, at the root of a
        cache artifact (whose root is mounted as the cache root)."""
        return cache_manifest_path(self.labels)

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
        doc = jsondoc.loads(data)
        labels = (doc.get("config") or {}).get("Labels") or {}
    except (ValueError, AttributeError):
        raise ImageLayoutError(f"{ref.pinned()}: image config {config.digest} is not JSON") from None
    if not isinstance(labels, dict):
        raise ImageLayoutError(f"{ref.pinned()}: image config labels are not a mapping")
    return {str(k): str(v) for k, v in labels.items()}


def top_manifest(client: RegistryClient, ref: Reference, top: Manifest | None) -> Manifest:
    """What ``ref`` names: ``top`` when the caller has read it already, else one GET."""
    if top is None:
        return client.get_manifest(ref)
    if ref.digest and top.digest != ref.digest:
        # A caller's bug, never a registry's answer: fail rather than read another image.
        raise ValueError(f"{ref}: the manifest passed is {top.digest}")
    return top


def read_image(client: RegistryClient, ref: Reference, top: Manifest) -> ImageFacts:
    """``ref`` must be pinned to ``top.digest``."""
    manifest = image_manifest(client, ref, top)
    return ImageFacts(ref, top, manifest, read_labels(client, ref, manifest))


@dataclasses.dataclass(frozen=True)
class CacheLayer:
    """What the image's last layer holds. ``inspect`` shows whatever cache manifest is there;
    signing and verification take it only as kernelbake writes it (``manifest_alone``)."""

    layer: Descriptor
    manifest: bytes | None  # the exact bytes of the cache manifest, when the layer holds it
    problem: str | None  # why the layer is not the cache manifest alone; None when it is

    def __post_init__(self) -> None:
        if self.manifest is None and self.problem is None:
            raise ValueError("CacheLayer without a cache manifest must say why (problem)")

    def manifest_alone(self) -> bytes:
        """The cache manifest's bytes, when nothing else is in the layer: anything else there
        would be bytes the attestation does not describe."""
        if self.problem is not None or self.manifest is None:
            raise ImageLayoutError(str(self.problem))
        return self.manifest


def _layer_files(blob: bytes, where: str, path: str) -> tuple[bytes | None, tuple[str, ...]]:
    """(the cache manifest's bytes or None, every other file), directories aside."""
    raw = gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob
    found: bytes | None = None
    others: list[str] = []
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        for member in tar:
            name = member.name.removeprefix("./").rstrip("/")
            if member.isdir():
                continue
            # A second copy, or a link at the path, is something else: only one file is read.
            if name != path or not member.isreg() or found is not None:
                others.append(name)
                continue
            if member.size > MAX_CACHE_MANIFEST_BYTES:
                raise ImageLayoutError(f"{where}: {path} is {member.size} bytes, too large")
            fh = tar.extractfile(member)
            found = fh.read() if fh else b""
    return found, tuple(others)


def read_cache_layer(client: RegistryClient, facts: ImageFacts) -> CacheLayer | None:
    """The image's last layer and the cache manifest in it; None when the image has no layers."""
    where = facts.ref.pinned()
    path = facts.cache_manifest_path
    layer = facts.last_layer
    if layer is None:
        return None
    if layer.media_type not in _LAYER_TYPES:
        raise ImageLayoutError(f"{where}: last layer is {layer.media_type}; expected a tar or tar+gzip layer")
    if layer.size > MAX_CACHE_LAYER_BYTES:
        # Not a cache-manifest layer (an image built FROM a kernelbake image, say): not fetched.
        return CacheLayer(
            layer,
            None,
            f"{where}: last layer {layer.digest} is {layer.size} bytes; it must hold only {path}",
        )
    blob = client.get_blob(facts.ref, layer.digest, max_bytes=MAX_CACHE_LAYER_BYTES)
    try:
        found, others = _layer_files(blob, where, path)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise ImageLayoutError(f"{where}: last layer {layer.digest} is not a readable tar ({exc})") from None
    problem = None
    if others:
        problem = f"{where}: last layer {layer.digest} holds {others[0]!r}; it must hold only {path}"
    elif found is None:
        problem = f"{where}: last layer {layer.digest} does not hold {path}"
    return CacheLayer(layer, found, problem)


def read_cache_manifest(client: RegistryClient, facts: ImageFacts) -> tuple[Descriptor, bytes]:
    """The last layer's descriptor and the exact bytes of the cache manifest, which must be
    the only file in that layer (directories aside)."""
    cache = read_cache_layer(client, facts)
    if cache is None:
        raise ImageLayoutError(f"{facts.ref.pinned()}: image has no layers, so no cache manifest")
    return cache.layer, cache.manifest_alone()


@dataclasses.dataclass(frozen=True)
class RemoteImage:
    ref: Reference  # as given
    digest: str  # what the reference resolved to (the index, for an index)
    labels: Mapping[str, str]
    layers: tuple[str, ...]
    cache_manifest: CacheManifest | None
    cache_manifest_digest: str | None


def inspect_remote(
    text: str, *, client: RegistryClient | None = None, top: Manifest | None = None
) -> RemoteImage:
    """Labels, layers and cache manifest of a pushed image; reads its config and last layer only.
    ``top``: what ``text`` names, when the caller has read it already (``fleet.read_top``)."""
    ref = parse_reference(text)
    client = client or RegistryClient()
    with registry_reachable(ref.registry):
        top = top_manifest(client, ref, top)
        facts = read_image(client, ref.with_digest(top.digest), top)
        cache = read_cache_layer(client, facts)
    raw = cache.manifest if cache is not None else None
    manifest = None
    if raw is not None:
        source = f"{facts.ref.pinned()} /{facts.cache_manifest_path}"
        manifest = CacheManifest.from_json(raw.decode("utf-8", "replace"), source=source)
    return RemoteImage(
        ref=ref,
        digest=top.digest,
        labels=facts.labels,
        layers=tuple(d.digest for d in facts.manifest.layers),
        cache_manifest=manifest,
        cache_manifest_digest=mt.sha256_digest(raw) if raw is not None else None,
    )
