"""One image index per model: the per-GPU variants and what each descriptor says about itself.

An OCI image index lists each GPU variant of a model with its compatibility key in the
descriptor's annotations (canonical string and digest, device, arch, engine), so a resolver
(``kernelbake resolve``, admission) can pick the variant for a node from the index alone.

What a runtime that knows nothing of kernelbake gets: nothing built for another GPU. Every GPU
variant's platform carries ``variant: kernelbake-<arch>`` (``linux/amd64/kernelbake-sm_90a``),
a CPU variant no container runtime matches when it resolves ``linux/amd64``; a plain
``docker pull`` of a GPU-only index therefore fails loudly ("no matching manifest") instead of
handing an H100 node the kernels of an L4, and a CPU variant (no GPU kernels), where the model
has one, is the index's first entry and stays plain ``linux/amd64``. We chose a loud failure
over a cold image in first place: starting silently at cold speed is the failure kernelbake
exists to prevent, and the digest to run is one ``kernelbake resolve`` away.

A cache-only artifact (``contract.artifact``) of a variant is listed beside its image, with
``dev.kernelbake.artifact: cache/v1`` in its annotations and the platform variant
``kernelbake-cache-<arch>``, which no runtime matches either: it is never run as an image.
Entries without that annotation are images, as every index written before it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from kernelbake.contract.artifact import LABEL_ARTIFACT, ArtifactKind, InvalidArtifact, kind_of
from kernelbake.contract.key import LABEL_NS, CacheKey, InvalidKey, parse_key
from kernelbake.errors import BadInput

ANNOTATION_KEY = f"{LABEL_NS}.key"
ANNOTATION_KEY_DIGEST = f"{LABEL_NS}.key.digest"
ANNOTATION_DEVICE = f"{LABEL_NS}.device"
ANNOTATION_ARCH = f"{LABEL_NS}.arch"
ANNOTATION_ENGINE = f"{LABEL_NS}.engine"
# On the index itself: what it is, for inspect and admission.
ANNOTATION_KIND = f"{LABEL_NS}.index"
INDEX_KIND = "gpu-variants/v1"
VARIANT_PREFIX = "kernelbake-"
CACHE_VARIANT_PREFIX = "kernelbake-cache-"

OCI_INDEX = "application/vnd.oci.image.index.v1+json"


class InvalidIndex(BadInput, ValueError):
    """An index whose kernelbake annotations are missing or disagree; names the entry."""


def is_gpu(key: CacheKey) -> bool:
    return key.device != "cpu"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Variant:
    """One entry of the index: an image (or a cache artifact) and the key it was baked with."""

    key: CacheKey
    digest: str
    size: int
    media_type: str
    os: str = "linux"
    architecture: str = "amd64"
    kind: ArtifactKind = ArtifactKind.IMAGE

    def platform(self) -> dict[str, str]:
        platform = {"architecture": self.architecture, "os": self.os}
        if self.kind is ArtifactKind.CACHE:
            platform["variant"] = f"{CACHE_VARIANT_PREFIX}{self.key.arch}"
        elif is_gpu(self.key):
            platform["variant"] = f"{VARIANT_PREFIX}{self.key.arch}"
        return platform

    def annotations(self) -> dict[str, str]:
        annotations = {
            ANNOTATION_KEY: str(self.key),
            ANNOTATION_KEY_DIGEST: self.key.digest,
            ANNOTATION_DEVICE: self.key.device,
            ANNOTATION_ARCH: self.key.arch,
            ANNOTATION_ENGINE: f"{self.key.engine.value} {self.key.engine_version}",
        }
        if self.kind is not ArtifactKind.IMAGE:
            annotations[LABEL_ARTIFACT] = self.kind.value
        return annotations

    def descriptor(self) -> dict[str, Any]:
        return {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
            "platform": self.platform(),
            "annotations": self.annotations(),
        }


def ordered(variants: Sequence[Variant]) -> list[Variant]:
    """Images before cache artifacts; in each, CPU variants (no GPU kernels) first, then GPU
    variants as given."""
    return sorted(variants, key=lambda v: (v.kind is ArtifactKind.CACHE, is_gpu(v.key)))


def of_kind(variants: Sequence[Variant], kind: ArtifactKind) -> tuple[Variant, ...]:
    return tuple(v for v in variants if v.kind is kind)


def index_document(variants: Sequence[Variant]) -> dict[str, Any]:
    if not variants:
        raise InvalidIndex("an index needs at least one variant")
    seen: dict[tuple[ArtifactKind, str], str] = {}
    for v in variants:
        if (v.kind, v.key.digest) in seen:
            raise InvalidIndex(
                f"{v.digest} and {seen[v.kind, v.key.digest]} are both a {v.kind.value} with the same key {v.key.digest}"
            )
        seen[v.kind, v.key.digest] = v.digest
    return {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [v.descriptor() for v in ordered(variants)],
        "annotations": {ANNOTATION_KIND: INDEX_KIND},
    }


def encode(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def index_tag(keys: Sequence[CacheKey]) -> str:
    """A tag for the index that changes when any variant's key does:
    ``vllm0.26.0-gpus-1a2b3c4d`` (OCI tag grammar)."""
    first = keys[0]
    joined = "\n".join(sorted(k.digest for k in keys))
    short = hashlib.sha256(joined.encode()).hexdigest()[:8]
    return f"{first.engine.value}{first.engine_version}-gpus-{short}"


def is_variant_index(doc: Mapping[str, Any]) -> bool:
    annotations = doc.get("annotations")
    return isinstance(annotations, dict) and annotations.get(ANNOTATION_KIND) == INDEX_KIND


def variants_from_index(doc: Mapping[str, Any], *, source: str) -> tuple[Variant, ...]:
    """The variants an index lists, every annotation checked against the key it carries.

    The key annotation is the source of truth; the digest, device and arch annotations must
    agree with it (an edit of one of them is caught, as ``key_from_labels`` does for labels).
    """
    if not is_variant_index(doc):
        raise InvalidIndex(f"{source}: not a kernelbake GPU-variant index (no {ANNOTATION_KIND} annotation)")
    entries = doc.get("manifests")
    if not isinstance(entries, list) or not entries:
        raise InvalidIndex(f"{source}: the index lists no manifests")
    out: list[Variant] = []
    for i, entry in enumerate(entries):
        where = f"{source}: manifests[{i}]"
        if not isinstance(entry, dict):
            raise InvalidIndex(f"{where}: not a descriptor")
        annotations = entry.get("annotations") or {}
        platform = entry.get("platform") or {}
        if not isinstance(annotations, dict) or not isinstance(platform, dict):
            raise InvalidIndex(f"{where}: annotations and platform must be mappings")
        try:
            key = parse_key(str(annotations.get(ANNOTATION_KEY, "")))
            kind = kind_of({k: str(v) for k, v in annotations.items()})
        except (InvalidKey, InvalidArtifact) as exc:
            raise InvalidIndex(f"{where}: {exc}") from None
        variant = Variant(
            key=key,
            digest=str(entry.get("digest", "")),
            size=int(entry.get("size", 0)),
            media_type=str(entry.get("mediaType", "")),
            os=str(platform.get("os", "")),
            architecture=str(platform.get("architecture", "")),
            kind=kind,
        )
        expected = variant.descriptor()
        if annotations != expected["annotations"] or platform != expected["platform"]:
            differ = sorted(k for k, v in expected["annotations"].items() if annotations.get(k) != v)
            if platform != expected["platform"]:
                differ.append("platform")
            raise InvalidIndex(f"{where}: annotations disagree with {ANNOTATION_KEY} on {', '.join(differ)}")
        out.append(variant)
    return tuple(out)
