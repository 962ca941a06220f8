"""OCI media types, descriptors and manifests kept as the exact bytes the registry holds."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.oci.errors import RegistryProtocolError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"

IMAGE_MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEXES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (*IMAGE_MANIFESTS, *INDEXES)

# The OCI empty descriptor's blob: ``{}``.
EMPTY_JSON = b"{}"


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    artifact_type: str | None = None
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    platform: Mapping[str, Any] | None = None

    @classmethod
    def of(
        cls,
        data: bytes,
        media_type: str,
        *,
        artifact_type: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> Descriptor:
        return cls(
            media_type=media_type,
            digest=sha256_digest(data),
            size=len(data),
            artifact_type=artifact_type,
            annotations=dict(annotations or {}),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.artifact_type:
            out["artifactType"] = self.artifact_type
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        if self.platform:
            out["platform"] = dict(self.platform)
        return out

    @classmethod
    def from_json(cls, doc: Any, *, source: str) -> Descriptor:
        try:
            annotations = doc.get("annotations") or {}
            if not isinstance(annotations, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
            ):
                raise TypeError("annotations must map strings to strings")
            size = doc["size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise TypeError(f"size {size!r} is not a non-negative integer")
            media_type, digest = doc["mediaType"], doc["digest"]
            if not isinstance(media_type, str) or not isinstance(digest, str):
                raise TypeError("mediaType and digest must be strings")
            artifact_type = doc.get("artifactType")
            platform = doc.get("platform")
            return cls(
                media_type=media_type,
                digest=digest,
                size=size,
                artifact_type=artifact_type if isinstance(artifact_type, str) else None,
                annotations=annotations,
                platform=platform if isinstance(platform, dict) else None,
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise RegistryProtocolError(f"{source}: bad descriptor ({exc})") from None


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A manifest or index exactly as stored; ``digest`` is the sha256 of ``data``."""

    media_type: str
    data: bytes
    digest: str
    source: str = ""

    @classmethod
    def from_bytes(cls, data: bytes, media_type: str, *, source: str) -> Manifest:
        manifest = cls(media_type, data, sha256_digest(data), source)
        declared = manifest.doc.get("mediaType")
        if isinstance(declared, str) and declared and declared != media_type:
            raise RegistryProtocolError(f"{source}: served as {media_type} but declares {declared}")
        return manifest

    @functools.cached_property
    def doc(self) -> dict[str, Any]:
        try:
            doc = jsondoc.loads(self.data)
        except ValueError as exc:
            raise RegistryProtocolError(f"{self.source}: manifest is not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise RegistryProtocolError(f"{self.source}: manifest is not a JSON object")
        return doc

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEXES

    def descriptor(self) -> Descriptor:
        return Descriptor(
            media_type=self.media_type,
            digest=self.digest,
            size=len(self.data),
            artifact_type=self.artifact_type,
            annotations=self.annotations,
        )

    @property
    def artifact_type(self) -> str | None:
        at = self.doc.get("artifactType")
        if isinstance(at, str):
            return at
        config = self.doc.get("config")
        return config.get("mediaType") if isinstance(config, dict) else None

    @property
    def annotations(self) -> dict[str, str]:
        ann = self.doc.get("annotations") or {}
        return {k: v for k, v in ann.items() if isinstance(k, str) and isinstance(v, str)}

    @property
    def config(self) -> Descriptor:
        return Descriptor.from_json(self.doc.get("config"), source=f"{self.source}: config")

    @property
    def layers(self) -> list[Descriptor]:
        layers = self.doc.get("layers")
        if not isinstance(layers, list):
            raise RegistryProtocolError(f"{self.source}: manifest has no layers list")
        return [Descriptor.from_json(d, source=f"{self.source}: layers[{i}]") for i, d in enumerate(layers)]

    @property
    def manifests(self) -> list[Descriptor]:
        entries = self.doc.get("manifests")
        if not isinstance(entries, list):
            raise RegistryProtocolError(f"{self.source}: index has no manifests list")
        return [
            Descriptor.from_json(d, source=f"{self.source}: manifests[{i}]") for i, d in enumerate(entries)
        ]

    @property
    def subject(self) -> Descriptor | None:
        subject = self.doc.get("subject")
        return None if subject is None else Descriptor.from_json(subject, source=f"{self.source}: subject")


def encode_json(doc: Mapping[str, Any]) -> bytes:
    """Compact, key-ordered JSON: what we push is stable for equal content."""
    return json.dumps(doc, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()
