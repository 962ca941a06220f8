"""The cache delta: what a running replica's caches gained since it started, for the next one.

A delta lists files that are *not* in the baked bundle (never other bytes for a baked path),
each under a cache kind's directory, with its size and sha256, and says what it is layered on:

- ``base_image``: the digest of the image (or cache artifact) the replica ran; admission
  compares it with the digest the pod is pinned to;
- ``base_manifest``: the sha256 of that image's pinned cache manifest; the runtime, which
  cannot know its own image digest, compares it with the manifest it pinned;
- ``key``: the compatibility key (``CacheKey`` string), the same as the image's;
- ``origin``: where its bytes come from (``Origin``): ``rebuilt`` by a trusted build that ran
  the signed image by digest and replayed what a replica recorded (``rebuild`` says which
  builder, which record, what it dropped), or ``replica``: the bytes a replica wrote, which only
  a policy with ``unsafe_replica_deltas`` accepts. A manifest that does not say is ``replica``.

On disk (the root of a delta, and of the OCI artifact that carries it)::

    <root>/delta.json          this manifest (``DELTA_MANIFEST``)
    <root>/<kind>/...          the files, at their bundle-relative paths

``to_json`` is canonical (sorted keys, one encoding), so the sha256 of ``delta.json`` names a
delta; admission pins it in ``$KERNELBAKE_DELTA_DIGEST`` after verifying the signature.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.contract.key import CacheKey, parse_key
from kernelbake.contract.layout import CacheKind
from kernelbake.contract.manifest import DIGEST, SHA256_HEX, bundle_path_problem, kind_totals
from kernelbake.errors import BadInput

SCHEMA = 1
DELTA_MANIFEST = "delta.json"
# Where a pod mounts the delta (an image volume of the delta artifact): outside the cache root,
# so the cache root's volume recipes cannot cover it, and not above serve's trusted files.
DELTA_ROOT = "/opt/kernelbake/delta"
# The sha256 of delta.json as whoever started the pod verified it (admission, after the
# delta's signature, key and base digest): without it a mounted delta is not used.
DELTA_DIGEST_ENV = "KERNELBAKE_DELTA_DIGEST"
# The OCI artifact: its artifactType, and the media types of its two layers.
ARTIFACT_TYPE = "application/vnd.kernelbake.cache-delta.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.kernelbake.cache-delta.manifest.v1+json"
# Bounds on what one delta may hold: a delta is read, hashed and copied at every start.
MAX_FILES = 100_000
MAX_BYTES = 64 << 30
MAX_MANIFEST_BYTES = 32 << 20


class InvalidDelta(BadInput, ValueError):
    """A delta manifest that is malformed or unsafe; the message names the field or path."""


DOCUMENT = jsondoc.Kind("cache delta", (SCHEMA,), MAX_MANIFEST_BYTES, InvalidDelta)


class Origin(enum.Enum):
    # Compiled again by a trusted build (the signed image run by digest, no network, its baked
    # caches as the start) from a replica's record: only that build's output is in the delta.
    REBUILT = "rebuilt"
    # The bytes a replica's cache root held, signed as they were: anything that could write
    # there (serving code, a sidecar on the volume) chose them. Accepted only as unsafe.
    REPLICA = "replica"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rebuild:
    """Which trusted build produced a rebuilt delta, and from what."""

    builder: str  # who ran it (the builder's name; the signer vouches for it)
    image: str  # sha256:… of the image it ran, by digest: the delta's base
    record: str  # sha256:… of the replica's record it replayed
    # Files the replica claimed that the rebuild did not produce: not in the delta.
    dropped: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "builder": self.builder,
            "image": self.image,
            "record": self.record,
            "dropped": list(self.dropped),
        }

    @classmethod
    def from_json(cls, doc: Any) -> Rebuild:
        if not isinstance(doc, dict):
            raise InvalidDelta("rebuild must be an object")
        return cls(
            builder=str(doc["builder"]),
            image=str(doc["image"]),
            record=str(doc["record"]),
            dropped=tuple(str(d) for d in doc.get("dropped", ())),
        )


def engine_key(kind: CacheKind, path: str) -> str | None:
    """The engine's own key for the cache entry ``path`` belongs to, where the directory layout
    names it: Triton keys each kernel's directory by its hash (``triton/<key>/…``), vLLM its
    compiled model by ``compute_hash()`` (``vllm/torch_compile_cache/<key>/…``), Inductor its
    FX graph entries (``inductor/fxgraph/<xx>/<key>/…``) and AOTAutograd entries
    (``inductor/aotautograd/<key>/…``). None elsewhere: the path alone does not say it, and
    kernelbake does not guess."""
    parts = path.split("/")
    if kind is CacheKind.TRITON and len(parts) >= 3:
        return parts[1]
    if kind is CacheKind.VLLM and len(parts) >= 4 and parts[1] == "torch_compile_cache":
        return parts[2]
    if kind is CacheKind.INDUCTOR and len(parts) >= 5 and parts[1] == "fxgraph":
        return parts[3]
    if kind is CacheKind.INDUCTOR and len(parts) >= 4 and parts[1] == "aotautograd":
        return parts[2]
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeltaFile:
    path: str  # bundle-relative, under its kind's directory
    size: int
    sha256: str
    kind: CacheKind

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeltaManifest:
    key: CacheKey
    base_image: str | None  # sha256:… of the image (or cache artifact) manifest; set at push
    base_manifest: str  # sha256:… of the base's pinned cache manifest
    files: tuple[DeltaFile, ...]
    # Free-form provenance: which replica, when (the attestation carries it signed).
    replica: str = ""
    origin: Origin = Origin.REPLICA
    rebuild: Rebuild | None = None  # set exactly when ``origin`` is ``REBUILT``

    def __post_init__(self) -> None:
        # One order, so that equal deltas are equal values and encode to the same bytes.
        object.__setattr__(self, "files", tuple(sorted(self.files, key=lambda f: f.path)))
        check(self)

    def totals(self) -> dict[str, dict[str, int]]:
        return kind_totals(self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def with_base(self, image_digest: str) -> DeltaManifest:
        return dataclasses.replace(self, base_image=image_digest)

    def to_json(self) -> str:
        doc = {
            "schema": SCHEMA,
            "key": str(self.key),
            "key_digest": self.key.digest,
            "base": {"image": self.base_image, "manifest": self.base_manifest},
            "replica": self.replica,
            "origin": self.origin.value,
            "rebuild": self.rebuild.to_json() if self.rebuild else None,
            "kinds": kinds_json(self.files),
        }
        return jsondoc.dumps(doc)

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = DELTA_MANIFEST) -> DeltaManifest:
        return DOCUMENT.read(text, source=source, build=cls._of)

    @classmethod
    def _of(cls, doc: dict[str, Any]) -> DeltaManifest:
        base = doc["base"]
        files = tuple(files_of(doc["kinds"]))
        try:
            # Written before deltas said where their bytes came from: a replica's.
            origin = Origin(doc.get("origin", Origin.REPLICA.value))
        except ValueError:
            raise InvalidDelta(
                f"origin {doc.get('origin')!r} is not one of {', '.join(o.value for o in Origin)}"
            ) from None
        rebuild = doc.get("rebuild")
        return cls(
            key=parse_key(doc["key"]),
            base_image=base.get("image"),
            base_manifest=base["manifest"],
            files=files,
            replica=str(doc.get("replica", "")),
            origin=origin,
            rebuild=None if rebuild is None else Rebuild.from_json(rebuild),
        )


def kinds_json(files: Iterable[DeltaFile]) -> dict[str, Any]:
    """Files per kind, with the engine's keys where the layout names them (``engine_key``)."""
    files = list(files)
    kinds: dict[str, Any] = {}
    for kind in sorted({f.kind for f in files}, key=lambda k: k.value):
        mine = [f for f in files if f.kind is kind]
        keys = sorted({k for f in mine if (k := engine_key(kind, f.path)) is not None})
        kinds[kind.value] = {
            "engine_keys": keys,
            "files": [f.to_json() for f in mine],
            "bytes": sum(f.size for f in mine),
        }
    return kinds


def files_of(kinds: Any) -> Iterable[DeltaFile]:
    """``kinds_json`` read back."""
    if not isinstance(kinds, dict):
        raise InvalidDelta("kinds must be an object")
    for name, entry in kinds.items():
        try:
            kind = CacheKind(name)
        except ValueError:
            known = ", ".join(k.value for k in CacheKind)
            raise InvalidDelta(f"{name!r} is not a cache kind ({known})") from None
        for raw in entry["files"]:
            yield DeltaFile(
                path=str(raw["path"]), size=int(raw["size"]), sha256=str(raw["sha256"]), kind=kind
            )


def check(delta: DeltaManifest) -> None:
    """Every invariant a delta must hold, whoever built it: a valid base, paths that stay in
    their kind's directory, each listed once, and bounded counts and bytes."""
    if not DIGEST.fullmatch(delta.base_manifest or ""):
        raise InvalidDelta(f"base manifest digest {delta.base_manifest!r} is not sha256:<64 hex>")
    if delta.base_image is not None and not DIGEST.fullmatch(delta.base_image):
        raise InvalidDelta(f"base image digest {delta.base_image!r} is not sha256:<64 hex>")
    _check_origin(delta)
    if len(delta.files) > MAX_FILES:
        raise InvalidDelta(f"{len(delta.files)} files, more than a delta may hold ({MAX_FILES})")
    seen: set[str] = set()
    for f in delta.files:
        if problem := bundle_path_problem(f.path, f.kind):
            raise InvalidDelta(f"file {f.path!r} {problem}")
        if f.size < 0 or not SHA256_HEX.fullmatch(f.sha256):
            raise InvalidDelta(f"file {f.path!r}: size or sha256 is not valid")
        if f.path in seen:
            raise InvalidDelta(f"file {f.path!r} is listed twice")
        seen.add(f.path)
    if (total := delta.total_bytes) > MAX_BYTES:
        raise InvalidDelta(f"{total} bytes, more than a delta may hold ({MAX_BYTES})")


def _check_origin(delta: DeltaManifest) -> None:
    if (delta.origin is Origin.REBUILT) != (delta.rebuild is not None):
        raise InvalidDelta(f"origin {delta.origin.value!r} and a rebuild record go together, or neither")
    if (r := delta.rebuild) is None:
        return
    for name, value in (("image", r.image), ("record", r.record)):
        if not DIGEST.fullmatch(value):
            raise InvalidDelta(f"rebuild.{name} {value!r} is not sha256:<64 hex>")
    if delta.base_image is not None and r.image != delta.base_image:
        raise InvalidDelta(f"rebuilt from the image {r.image}, but layered on {delta.base_image}")


def _conflicts(files: Mapping[str, str], baked: Mapping[str, str]) -> list[str]:
    """The delta's files that would give a baked path (path → sha256) other bytes. A delta never
    replaces a baked file; the same bytes again are harmless and skipped."""
    return [
        f"{path}: the delta has sha256 {sha}, the baked file {baked[path]}"
        for path, sha in sorted(files.items())
        if path in baked and baked[path] != sha
    ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layering:
    """What a delta says it is layered on, or what an image is, as far as the one who checks
    knows it: ``None`` is not known there, and is not compared (``serve`` cannot know its own
    image's digest; admission reads no file list)."""

    key: CacheKey
    manifest: str | None  # sha256:… of the pinned cache manifest
    image: str | None = None  # sha256:… of the image
    files: Mapping[str, str] | None = None  # path → sha256: the delta's files, or the baked ones

    @classmethod
    def of(cls, delta: DeltaManifest) -> Layering:
        return cls(
            key=delta.key,
            manifest=delta.base_manifest,
            image=delta.base_image,
            files={f.path: f.sha256 for f in delta.files},
        )


_SHOWN = 3


def base_problems(delta: Layering, base: Layering, *, named: str) -> list[str]:
    """Why a delta does not belong on ``base`` (empty: it does), the one rule that the push, the
    webhook and ``serve`` each apply with what they know of both: the same image, the same key,
    the same pinned bundle, and no baked file given other bytes. ``named`` is how the messages
    name the base ("this image", "the pod's image")."""
    problems = []
    if None not in (delta.image, base.image) and delta.image != base.image:
        problems.append(
            f"the delta is layered on {delta.image}, but {named} is {base.image}; capture a delta from a "
            f"replica of {named}"
        )
    if delta.key != base.key:
        problems.append(f"the delta is for key {delta.key.digest}, {named}'s is {base.key.digest}")
    if None not in (delta.manifest, base.manifest) and delta.manifest != base.manifest:
        problems.append(
            f"the delta is layered on the bundle {delta.manifest}, {named} pins {base.manifest}; capture a "
            f"delta from a replica of {named}"
        )
    if delta.files is not None and base.files is not None and (found := _conflicts(delta.files, base.files)):
        problems.append(f"the delta would replace baked files: {'; '.join(found[:_SHOWN])}")
    return problems
