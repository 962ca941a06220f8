"""The cache-only artifact: a model's compiled caches for one GPU, without the engine.

A minimal OCI image (``FROM scratch``) whose root is the cache root of a kernelbake image
(``/manifest.json``, ``/<kind>/…``, one layer per kind, the manifest last and alone), so that
a Kubernetes image volume, ``podman --mount type=image`` or ``docker create`` + copy brings it
to the *unchanged* engine image it was compiled in, which copies it to ``/opt/kernelbake/cache``
(writable: Inductor takes lock files there even on a warm start). Its config labels say what it
is and what it must be used with:

- the key labels, as on images (``CacheKey.labels``);
- ``dev.kernelbake.artifact=cache/v1``: an image whose root is a cache bundle, not a rootfs;
- the engine image (the build's runtime-stage base): the name it was built from and its
  config digest, which a registry copy or a re-push keeps; and its manifest digest when the
  build saw one;
- the cache manifest's digest, and the engine command and environment kernelbake's own image
  would start the engine with (so a pod without kernelbake can start it the same way).

The signature and the attestation bind all of these (``signing.predicate``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.contract.key import LABEL_NS
from kernelbake.contract.layout import CACHE_MANIFEST_PATH, MANIFEST
from kernelbake.errors import BadInput

LABEL_ARTIFACT = f"{LABEL_NS}.artifact"
LABEL_ENGINE_IMAGE = f"{LABEL_NS}.engine-image"
LABEL_ENGINE_CONFIG = f"{LABEL_NS}.engine-image.config"
LABEL_ENGINE_DIGEST = f"{LABEL_NS}.engine-image.digest"
LABEL_MANIFEST_DIGEST = f"{LABEL_NS}.cache.manifest-digest"
LABEL_COMMAND = f"{LABEL_NS}.engine.command"
LABEL_ENV = f"{LABEL_NS}.engine.env"
# The tag suffix of a target's cache artifact beside its image (``…:<tag>-cache``).
TAG_SUFFIX = "-cache"
# What the runtime reads (``kernelbake.runtime.env``) to bind a mounted cache to a signature.
MANIFEST_DIGEST_ENV = "KERNELBAKE_MANIFEST_DIGEST"


class ArtifactKind(enum.Enum):
    """What a kernelbake OCI manifest is: an image that serves, or caches for a stock image."""

    IMAGE = "image"
    CACHE = "cache/v1"


class InvalidArtifact(BadInput, ValueError):
    """Artifact labels that are missing or malformed; names the label."""


def kind_of(labels: Mapping[str, str]) -> ArtifactKind:
    """IMAGE for labels without ``dev.kernelbake.artifact`` (every image built before it)."""
    raw = labels.get(LABEL_ARTIFACT)
    if raw is None:
        return ArtifactKind.IMAGE
    try:
        kind = ArtifactKind(raw)
    except ValueError:
        known = ", ".join(k.value for k in ArtifactKind if k is not ArtifactKind.IMAGE)
        raise InvalidArtifact(f"label {LABEL_ARTIFACT}={raw!r}: expected {known}") from None
    if kind is ArtifactKind.IMAGE:
        raise InvalidArtifact(f"label {LABEL_ARTIFACT}={raw!r}: images carry no {LABEL_ARTIFACT} label")
    return kind


def cache_manifest_path(labels: Mapping[str, str]) -> str:
    """Where the cache manifest is, relative to the root of the image these labels belong to."""
    return MANIFEST if kind_of(labels) is ArtifactKind.CACHE else CACHE_MANIFEST_PATH


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineImage:
    """The image an artifact's caches were compiled in."""

    name: str
    config_digest: str  # sha256:… of the image config; survives a re-push under another name
    digest: str | None = None  # sha256:… of the manifest the build pulled, when there was one


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheArtifactFacts:
    """What an artifact's labels say beyond its key; every field is attested."""

    engine: EngineImage
    manifest_digest: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]

    def labels(self) -> dict[str, str]:
        labels = {
            LABEL_ARTIFACT: ArtifactKind.CACHE.value,
            LABEL_ENGINE_IMAGE: self.engine.name,
            LABEL_ENGINE_CONFIG: self.engine.config_digest,
            LABEL_MANIFEST_DIGEST: self.manifest_digest,
            LABEL_COMMAND: json.dumps(list(self.command), separators=(",", ":")),
            LABEL_ENV: json.dumps(dict(self.env), sort_keys=True, separators=(",", ":")),
        }
        if self.engine.digest:
            labels[LABEL_ENGINE_DIGEST] = self.engine.digest
        return labels

    def to_json(self) -> dict[str, Any]:
        return {
            "engineImage": {
                "name": self.engine.name,
                "config": self.engine.config_digest,
                "digest": self.engine.digest,
            },
            "manifestDigest": self.manifest_digest,
            "command": list(self.command),
            "env": dict(self.env),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, source: str) -> CacheArtifactFacts:
        try:
            engine = doc["engineImage"]
            facts = cls(
                engine=EngineImage(
                    name=engine["name"], config_digest=engine["config"], digest=engine.get("digest")
                ),
                manifest_digest=doc["manifestDigest"],
                command=tuple(doc["command"]),
                env=tuple(sorted(dict(doc["env"]).items())),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidArtifact(
                f"{source}: not a cache artifact record ({type(exc).__name__}: {exc})"
            ) from None
        facts.check(source)
        return facts

    def check(self, source: str) -> None:
        for name, value in (
            ("engine image config", self.engine.config_digest),
            ("manifest", self.manifest_digest),
        ):
            if not _is_digest(value):
                raise InvalidArtifact(f"{source}: {name} digest {value!r} is not sha256:<64 hex>")
        if self.engine.digest is not None and not _is_digest(self.engine.digest):
            raise InvalidArtifact(
                f"{source}: engine image digest {self.engine.digest!r} is not sha256:<64 hex>"
            )
        if not self.engine.name or not self.command or not all(isinstance(a, str) for a in self.command):
            raise InvalidArtifact(f"{source}: engine image name and command must be non-empty strings")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env):
            raise InvalidArtifact(f"{source}: engine env must map names to strings")


def _is_digest(value: object) -> bool:
    if not isinstance(value, str) or not value.startswith("sha256:"):
        return False
    hexpart = value.removeprefix("sha256:")
    return len(hexpart) == 64 and all(c in "0123456789abcdef" for c in hexpart)


def artifact_facts(labels: Mapping[str, str], *, source: str) -> CacheArtifactFacts:
    """The facts a cache artifact's labels carry; ``InvalidArtifact`` naming a missing or bad one."""
    if kind_of(labels) is not ArtifactKind.CACHE:
        raise InvalidArtifact(
            f"{source}: no {LABEL_ARTIFACT}={ArtifactKind.CACHE.value} label; not a cache artifact"
        )
    missing = [
        n
        for n in (LABEL_ENGINE_IMAGE, LABEL_ENGINE_CONFIG, LABEL_MANIFEST_DIGEST, LABEL_COMMAND, LABEL_ENV)
        if not labels.get(n)
    ]
    if missing:
        raise InvalidArtifact(f"{source}: cache artifact without label {', '.join(missing)}")
    try:
        command = jsondoc.loads(labels[LABEL_COMMAND])
        env = jsondoc.loads(labels[LABEL_ENV])
        if not isinstance(command, list) or not isinstance(env, dict):
            raise ValueError("not a list and an object")
    except ValueError as exc:
        raise InvalidArtifact(
            f"{source}: labels {LABEL_COMMAND} and {LABEL_ENV} must be JSON ({exc})"
        ) from None
    facts = CacheArtifactFacts(
        engine=EngineImage(
            name=labels[LABEL_ENGINE_IMAGE],
            config_digest=labels[LABEL_ENGINE_CONFIG],
            digest=labels.get(LABEL_ENGINE_DIGEST) or None,
        ),
        manifest_digest=labels[LABEL_MANIFEST_DIGEST],
        command=tuple(command),
        env=tuple(sorted(env.items())),
    )
    facts.check(source)
    return facts


def artifact_ref(image_ref: str) -> str:
    """``repo:tag`` → ``repo:tag-cache``: the artifact sits beside its image in one repository,
    so that one variant index can list both."""
    name, sep, tag = image_ref.rpartition(":")
    if not sep or "/" in tag:
        raise BadInput(f"{image_ref}: expected REPO:TAG")
    return f"{name}:{tag}{TAG_SUFFIX}"
