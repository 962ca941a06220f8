"""What a verification found, as one closed type, and the gateway's answer around it.

A governed reference verifies as one of four kinds (``Subject``): a kernelbake image, a cache
artifact (``contract.artifact``), a cache delta (``contract.delta``) or a process snapshot
(``contract.snapshot``); a model's GPU index is an answer of its own (``IndexAccepted``: the
variant a pod runs is verified next). signing makes the verified objects; admission does not
import it (the gateway and the rules stay free of it), so what admission needs of each is a
Protocol here, and ``verifying``, the one module bound to signing, wraps each in its kind.
Which kind a review holds is asked once, with one ``match`` (``Subjects.of``), never by probing
for attributes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Protocol, TypeAlias, assert_never

from kernelbake.admission.frozen import fast_init
from kernelbake.contract.artifact import CacheArtifactFacts
from kernelbake.contract.key import CacheKey
from kernelbake.contract.snapshot import SnapshotKey
from kernelbake.contract.variants import Variant


class Keyed(Protocol):
    """What every subject and everything that verified has: its digest and its cache key."""

    @property
    def digest(self) -> str: ...

    @property
    def key(self) -> CacheKey: ...


class Verified(Keyed, Protocol):
    """What admission needs of anything that verified: its digest, cache key and signer."""

    @property
    def signer(self) -> str: ...


class ImageLike(Verified, Protocol):
    """What admission needs of ``signing.verify.VerifiedImage`` (an image or a cache artifact)."""

    # sha256 of the image's pinned cache manifest, as attested.
    @property
    def manifest_digest(self) -> str: ...


class DeltaLike(Verified, Protocol):
    """What admission needs of ``signing.delta.VerifiedDelta``."""

    @property
    def base_digest(self) -> str: ...

    @property
    def base_manifest(self) -> str: ...

    @property
    def manifest_digest(self) -> str: ...

    @property
    def origin(self) -> str: ...


class SnapshotLike(Verified, Protocol):
    """What admission needs of a verified snapshot (``verifying.VerifiedSnapshotVolume``): its
    ``key`` is the cache key of the image it was taken from."""

    @property
    def base_digest(self) -> str: ...

    @property
    def manifest_digest(self) -> str: ...

    @property
    def snapshot_key(self) -> SnapshotKey: ...

    @property
    def environment(self) -> Mapping[str, str] | None: ...


class _OfVerified:
    """A subject's digest and key: those of what verified (each kind's ``verified`` field)."""

    verified: Verified

    @property
    def digest(self) -> str:
        return self.verified.digest

    @property
    def key(self) -> CacheKey:
        return self.verified.key


@dataclasses.dataclass(frozen=True)
class Image(_OfVerified):
    """A kernelbake image (or a GPU index's image variant)."""

    verified: ImageLike


@dataclasses.dataclass(frozen=True)
class CacheArtifact(_OfVerified):
    """A cache-only artifact, with the facts its labels carry (signed with its config)."""

    verified: ImageLike
    facts: CacheArtifactFacts


@dataclasses.dataclass(frozen=True)
class Delta(_OfVerified):
    """A capture delta, layered on the image it names."""

    verified: DeltaLike


@dataclasses.dataclass(frozen=True)
class Snapshot(_OfVerified):
    """A process snapshot, taken from the image it names."""

    verified: SnapshotLike


Subject: TypeAlias = Image | CacheArtifact | Delta | Snapshot


@dataclasses.dataclass(frozen=True)
class VerifiedIndex:
    """A model's GPU-variant index whose signature verified: the variants it lists (each is
    verified on its own when a pod is sent to it)."""

    digest: str
    signer: str
    variants: tuple[Variant, ...]


@dataclasses.dataclass(frozen=True)
class Accepted:
    subject: Subject


@dataclasses.dataclass(frozen=True)
class IndexAccepted:
    index: VerifiedIndex


@dataclasses.dataclass(frozen=True)
class Rejected:
    reason: str


@dataclasses.dataclass(frozen=True)
class Unavailable:
    reason: str


Outcome: TypeAlias = Accepted | IndexAccepted | Rejected | Unavailable


@fast_init
@dataclasses.dataclass(frozen=True)
class Subjects:
    """The accepted outcomes of one review by kind (verified target → what it verified as)."""

    images: Mapping[str, ImageLike]
    artifacts: Mapping[str, CacheArtifact]
    deltas: Mapping[str, DeltaLike]
    snapshots: Mapping[str, SnapshotLike]

    @classmethod
    def of(cls, outcomes: Mapping[str, Outcome]) -> Subjects:
        images: dict[str, ImageLike] = {}
        artifacts: dict[str, CacheArtifact] = {}
        deltas: dict[str, DeltaLike] = {}
        snapshots: dict[str, SnapshotLike] = {}
        for target, outcome in outcomes.items():
            if not isinstance(outcome, Accepted):
                continue
            match outcome.subject:
                case Image(verified=image):
                    images[target] = image
                case CacheArtifact() as artifact:
                    artifacts[target] = artifact
                case Delta(verified=delta):
                    deltas[target] = delta
                case Snapshot(verified=snapshot):
                    snapshots[target] = snapshot
                case unknown:
                    # A fifth kind fails type-checking here, not at run time.
                    assert_never(unknown)
        return cls(images, artifacts, deltas, snapshots)
