"""kernelbake's attestation predicate: what kernels an image holds and what they were built for."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from kernelbake import __version__
from kernelbake.contract.artifact import (
    ArtifactKind,
    CacheArtifactFacts,
    InvalidArtifact,
    artifact_facts,
    kind_of,
)
from kernelbake.contract.key import CacheKey, InvalidKey, parse_key
from kernelbake.contract.layout import CACHE_MANIFEST_PATH
from kernelbake.contract.manifest import Manifest as CacheManifest
from kernelbake.errors import BadInput
from kernelbake.labels import check_labels
from kernelbake.oci.reference import is_digest
from kernelbake.oci.types import sha256_digest
from kernelbake.remote import ImageFacts

PREDICATE_TYPE = "https://kernelbake.dev/attestation/kernel-cache/v1"
BASE_NAME_LABEL = "org.opencontainers.image.base.name"
BASE_DIGEST_LABEL = "org.opencontainers.image.base.digest"


class BadPredicate(BadInput):
    """A predicate that does not have our shape."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelCachePredicate:
    key: CacheKey
    cache_manifest_digest: str
    cache_layer_digest: str
    base_image: str | None
    base_digest: str | None
    # compile_report.builder from the cache manifest: the builder's GPU + driver, or "cpu".
    builder: Any
    kernelbake_version: str
    # Relative to the root of what was signed: the cache root of an image, the root of a cache artifact.
    cache_manifest_path: str = CACHE_MANIFEST_PATH
    # A cache artifact's engine image, manifest digest, engine command and env (its labels).
    artifact: CacheArtifactFacts | None = None

    def to_json(self) -> dict[str, Any]:
        doc = {
            "key": str(self.key),
            "keyDigest": self.key.digest,
            "keyFields": self.key.as_dict(),
            "cacheManifest": {
                "path": "/" + self.cache_manifest_path,
                "digest": self.cache_manifest_digest,
                "layerDigest": self.cache_layer_digest,
            },
            "baseImage": {"name": self.base_image, "digest": self.base_digest},
            "builder": self.builder,
            "kernelbakeVersion": self.kernelbake_version,
        }
        if self.artifact is not None:
            doc["cacheArtifact"] = self.artifact.to_json()
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, source: str) -> KernelCachePredicate:
        try:
            key = parse_key(doc["key"])
            if doc.get("keyDigest") != key.digest:
                raise BadPredicate(f"{source}: keyDigest {doc.get('keyDigest')!r} is not the key's digest")
            if doc.get("keyFields") != key.as_dict():
                raise BadPredicate(f"{source}: keyFields disagree with key")
            cache, base = doc["cacheManifest"], doc.get("baseImage") or {}
            digest, layer = cache["digest"], cache["layerDigest"]
            if not (
                isinstance(digest, str) and is_digest(digest) and isinstance(layer, str) and is_digest(layer)
            ):
                raise BadPredicate(f"{source}: cacheManifest digests are not sha256:<hex>")
            version = doc["kernelbakeVersion"]
            if not isinstance(version, str):
                raise BadPredicate(f"{source}: kernelbakeVersion is not a string")
            path = cache.get("path", "/" + CACHE_MANIFEST_PATH)
            if not isinstance(path, str) or not path.startswith("/"):
                raise BadPredicate(f"{source}: cacheManifest.path {path!r} is not an absolute path")
            artifact = doc.get("cacheArtifact")
            facts = None if artifact is None else CacheArtifactFacts.from_json(artifact, source=source)
            return cls(
                key=key,
                cache_manifest_digest=digest,
                cache_layer_digest=layer,
                base_image=_opt_str(base.get("name")),
                base_digest=_opt_str(base.get("digest")),
                builder=doc.get("builder"),
                kernelbake_version=version,
                cache_manifest_path=path.removeprefix("/"),
                artifact=facts,
            )
        except (InvalidKey, InvalidArtifact) as exc:
            raise BadPredicate(f"{source}: {exc}") from None
        except (KeyError, TypeError, AttributeError) as exc:
            raise BadPredicate(
                f"{source}: not a {PREDICATE_TYPE} predicate ({type(exc).__name__}: {exc})"
            ) from None


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def predicate_for(facts: ImageFacts, layer_digest: str, cache_manifest: bytes) -> KernelCachePredicate:
    """The predicate a signer attests, read from the image itself; refuses an inconsistent image."""
    where = facts.ref.pinned()
    checked = check_labels(facts.labels)
    if checked.problems:
        raise BadInput(f"{where}: labels are inconsistent: {'; '.join(checked.problems)}")
    key = checked.key
    source = f"{where}: /{facts.cache_manifest_path}"
    parsed = CacheManifest.from_json(cache_manifest.decode("utf-8", "replace"), source=source)
    if parsed.key != key:
        raise BadInput(f"{source}: built for key {parsed.key.digest}, but the labels say {key.digest}")
    artifact = None
    if kind_of(facts.labels) is ArtifactKind.CACHE:
        artifact = artifact_facts(facts.labels, source=where)
        if artifact.manifest_digest != sha256_digest(cache_manifest):
            raise BadInput(
                f"{where}: label says cache manifest {artifact.manifest_digest}, "
                f"the artifact holds {sha256_digest(cache_manifest)}"
            )
    return KernelCachePredicate(
        key=key,
        cache_manifest_digest=sha256_digest(cache_manifest),
        cache_layer_digest=layer_digest,
        base_image=facts.labels.get(BASE_NAME_LABEL),
        base_digest=facts.labels.get(BASE_DIGEST_LABEL),
        builder=json.loads(json.dumps(dict(parsed.compile_report).get("builder"))),
        kernelbake_version=__version__,
        cache_manifest_path=facts.cache_manifest_path,
        artifact=artifact,
    )
