"""A process snapshot as an OCI artifact: pushed as a referrer of the image it was taken from,
signed, attested; and verified as admission must before a pod may restore it.

Why this shape and not a Podman/CRI-O checkpoint image (what the kubelet's ContainerCheckpoint
API writes): those hold a whole container (its rootfs diff, config.dump, spec.dump, the
runtime's own checkpoint of PID 1) and are restored by the container runtime as the
container, with no step of ours before it; the runtime cannot check a key, fall back, or mark
a node. Ours holds only the serving tree below ``kernelbake serve`` (the container's PID 1
stays serve), so serve's gate runs first, and a refusal is a baked start in the same
container. The rootfs is not copied: the subject is the image by digest, and the key holds it.

The artifact is a minimal image (so that an image volume can mount it at ``SNAPSHOT_ROOT``):
one tar layer with ``images/`` (CRIU's files, the engine log), then, for a snapshot with its
weights beside, each weights part file (about 1 GiB) in a layer of its own, then a layer holding
``snapshot.json`` alone. A layer a part: tens of GB pull as many blobs side by side rather than
as one stream, and a part whose bytes another snapshot already pushed is not stored twice; config labels carry the image's cache key labels and the snapshot
key's digest; ``artifactType`` ``ARTIFACT_TYPE``, ``subject`` the image. Signed like images
(``sign_image``, signature only), attested with a ``SNAPSHOT_PREDICATE_TYPE`` statement.
"""

from __future__ import annotations

import dataclasses
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernelbake.contract.artifact import LABEL_ARTIFACT
from kernelbake.contract.key import LABEL_NS, key_from_labels
from kernelbake.contract.snapshot import (
    ARTIFACT_TYPE,
    IMAGES_DIR,
    MAX_MANIFEST_BYTES,
    SNAPSHOT_MANIFEST,
    WEIGHTS_COPY,
    InvalidSnapshot,
    SnapshotFile,
    SnapshotKey,
    SnapshotManifest,
    under,
)
from kernelbake.errors import BadInput
from kernelbake.oci import Reference, RegistryClient, fallback_tag, parse_reference
from kernelbake.oci.types import sha256_digest
from kernelbake.remote import ImageFacts
from kernelbake.signing import referrer
from kernelbake.signing.errors import SnapshotRefused
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.signer import Signer
from kernelbake.signing.tarstream import FileTar, Member

SNAPSHOT_PREDICATE_TYPE = "https://kernelbake.dev/attestation/snapshot/v1"
SNAPSHOT_ARTIFACT = "snapshot/v1"
LABEL_SNAPSHOT_KEY = f"{LABEL_NS}.snapshot.key-digest"
LABEL_SNAPSHOT_MANIFEST = f"{LABEL_NS}.snapshot.manifest-digest"
TAG_SUFFIX = "-snapshot"
# A base named by digest alone (what `make image` writes to build/image.ref): one tag per base
# digest, as a delta's, so snapshots of two images of one repository do not take each other's tag.
TAG_PREFIX = "snapshot-"
# Weights part files a snapshot may push, a layer each (1 GiB a part: 512 GiB of weights).
MAX_WEIGHT_LAYERS = 512
KIND = referrer.Kind(
    artifact_type=ARTIFACT_TYPE,
    manifest=SNAPSHOT_MANIFEST,
    max_manifest_bytes=MAX_MANIFEST_BYTES,
    predicate_type=SNAPSHOT_PREDICATE_TYPE,
    what="snapshot",
    layers=f"images, each weights part file alone, then {SNAPSHOT_MANIFEST} alone",
    refused=SnapshotRefused,
    max_layers=MAX_WEIGHT_LAYERS + 2,
)


def load_dir(path: Path) -> tuple[SnapshotManifest, bytes]:
    """What ``snapshot take`` wrote: every file snapshot.json lists a plain file of its size,
    nothing unlisted (each file's sha256 is checked as its layer's digest is taken, before the
    first byte is pushed: ``tarstream``)."""
    data = referrer.read_written(path, KIND, by="kernelbake snapshot take")
    manifest = SnapshotManifest.from_json(data, source=str(path / SNAPSHOT_MANIFEST))
    if rel := referrer.unlisted(path, path / IMAGES_DIR, (f.path for f in manifest.files)):
        raise BadInput(
            f"{path / rel}: not listed in {SNAPSHOT_MANIFEST}; a snapshot pushes only what it lists"
        )
    for f in manifest.files:
        p = path / f.path
        st = p.lstat() if p.exists() or p.is_symlink() else None
        if st is None or not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{p}: missing or not a plain file, but {SNAPSHOT_MANIFEST} lists it")
        if st.st_size != f.size:
            raise BadInput(f"{p}: {st.st_size} B, {SNAPSHOT_MANIFEST} records {f.size} B")
    return manifest, data


def _layer(root: Path, files: Sequence[SnapshotFile]) -> referrer.Layer:
    """One layer of ``files``, its digest taken by reading them (each checked against its
    sha256), its bytes made again as it is uploaded."""
    tar = FileTar(root, tuple(Member(path=f.path, size=f.size, sha256=f.sha256) for f in files))
    try:
        return referrer.Layer(descriptor=tar.descriptor(), tar=tar)
    except OSError as exc:
        raise BadInput(f"{root}: a file of the snapshot could not be read: {exc}") from None


def layer_files(manifest: SnapshotManifest) -> list[tuple[SnapshotFile, ...]]:
    """The snapshot's files as its layers hold them: CRIU's files and the rest first, then each
    weights part file alone (``WEIGHTS_COPY``'s ``part-*.bin``), in path order."""
    parts = [f for f in manifest.files if under(f.path, WEIGHTS_COPY) and f.path.endswith(".bin")]
    alone = {f.path for f in parts}
    rest = tuple(f for f in manifest.files if f.path not in alone)
    if len(parts) > MAX_WEIGHT_LAYERS:
        raise BadInput(
            f"the snapshot's weights are {len(parts)} part files; a snapshot pushes at most "
            f"{MAX_WEIGHT_LAYERS}, a layer each"
        )
    return [rest, *((f,) for f in parts)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PushedSnapshot:
    reference: str
    base: str
    manifest_digest: str  # sha256 of snapshot.json: what $KERNELBAKE_SNAPSHOT_DIGEST pins
    key_digest: str
    files: int
    bytes: int
    signer: str

    def describe(self) -> str:
        return (
            f"pushed snapshot {self.reference} ({self.files} files, {self.bytes} B) referring to {self.base}, "
            f"signed and attested by {self.signer}; snapshot.json {self.manifest_digest}, key {self.key_digest}"
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _base(client: RegistryClient, base: str) -> tuple[Reference, ImageFacts]:
    return referrer.pinned_base(client, base, pinned_as="the one the snapshot was taken from")


def _check_base(where: str, key: SnapshotKey, facts: ImageFacts, base_digest: str) -> None:
    if key.image != base_digest:
        raise SnapshotRefused(f"{where}: taken from image {key.image}, not {base_digest}")
    image_key = key_from_labels(facts.labels)
    if key.cache_key != image_key:
        raise SnapshotRefused(
            f"{where}: the snapshot's cache key is {key.cache_key.digest}, the image's is {image_key.digest}"
        )


def default_tag(base_tag: str | None, base_digest: str) -> str:
    """Where ``push`` puts a snapshot without ``--to``: ``<tag>-snapshot`` beside a tagged base,
    ``snapshot-sha256-<hex>`` for a base named by digest alone."""
    return f"{base_tag}{TAG_SUFFIX}" if base_tag else TAG_PREFIX + fallback_tag(base_digest)


def push_snapshot(
    path: Path, *, base: str, signer: Signer, to: str | None = None, client: RegistryClient | None = None
) -> PushedSnapshot:
    """Push the snapshot in ``path`` as a referrer of ``base``, then sign and attest it;
    everything is checked before the first byte is pushed."""
    client = client or RegistryClient()
    manifest, data = load_dir(path)
    base_ref, facts = _base(client, base)
    assert base_ref.digest is not None
    _check_base(str(path), manifest.key, facts, base_ref.digest)
    dest = parse_reference(to) if to else base_ref.with_tag(default_tag(base_ref.tag, base_ref.digest))
    if dest.tag is None:
        raise BadInput(f"{to}: expected REPO:TAG to push the snapshot to")
    layers = [_layer(path, files) for files in layer_files(manifest)]
    artifact = _artifact(manifest, data, layers, base_ref, signer)
    pinned = referrer.publish(client, artifact, base=base_ref, facts=facts, dest=dest, signer=signer)
    return PushedSnapshot(
        reference=pinned.pinned(),
        base=base_ref.pinned(),
        manifest_digest=sha256_digest(data),
        key_digest=manifest.key.digest,
        files=len(manifest.files),
        bytes=manifest.total_bytes,
        signer=signer.identity,
    )


def _artifact(
    manifest: SnapshotManifest, data: bytes, files: Sequence[referrer.Layer], base: Reference, signer: Signer
) -> referrer.Artifact:
    """The snapshot as the artifact pushed: its files' layers, then snapshot.json alone."""
    return referrer.Artifact(
        kind=KIND,
        layers=(*files, referrer.Layer.of(referrer.manifest_tar(SNAPSHOT_MANIFEST, data))),
        labels={
            **manifest.key.cache_key.labels(),
            LABEL_ARTIFACT: SNAPSHOT_ARTIFACT,
            LABEL_SNAPSHOT_KEY: manifest.key.digest,
            LABEL_SNAPSHOT_MANIFEST: sha256_digest(data),
        },
        annotations={LABEL_SNAPSHOT_MANIFEST: sha256_digest(data), LABEL_SNAPSHOT_KEY: manifest.key.digest},
        predicate={
            "baseImage": {"name": base.name, "digest": base.digest},
            "snapshotKey": str(manifest.key),
            "keyDigest": manifest.key.digest,
            "cacheKeyDigest": manifest.key.cache_key.digest,
            "snapshotManifest": {"path": "/" + SNAPSHOT_MANIFEST, "digest": sha256_digest(data)},
            "files": len(manifest.files),
            "bytes": manifest.total_bytes,
            "taken": dict(manifest.taken),
            "signer": signer.identity,
        },
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedSnapshot(referrer.Verified[SnapshotKey]):
    """A snapshot whose signature the policy trusts; ``base_digest`` is the image it refers to
    (its subject, and the key's image), ``manifest_digest`` what $KERNELBAKE_SNAPSHOT_DIGEST
    must be."""

    # snapshot.json's record of the environment its key digests (None before it was recorded).
    environment: Mapping[str, str] | None = None

    def describe(self) -> str:
        return (
            f"verified snapshot {self.reference}: signed by {self.signer}; refers to {self.base_digest}; "
            f"key {self.key.digest}; {self.files} files ({self.bytes} B); snapshot.json {self.manifest_digest}"
        )


def read_snapshot(client: RegistryClient, reference: str, policy: VerifyPolicy) -> VerifiedSnapshot:
    """A trusted signature on the artifact's digest, its ``artifactType`` and its layers (its
    files, each weights part, snapshot.json: ``referrer.read``), and a snapshot.json whose key
    names the manifest's subject as its image. Raises a ``VerificationFailed`` subclass."""
    found = referrer.read(client, reference, policy, KIND)
    where = found.where
    data = referrer.manifest_file(client, found, KIND)
    try:
        manifest = SnapshotManifest.from_json(data, source=f"{where}: {SNAPSHOT_MANIFEST}")
    except InvalidSnapshot as exc:
        raise SnapshotRefused(str(exc)) from None
    if manifest.key.image != found.subject.digest:
        raise SnapshotRefused(
            f"{where}: {SNAPSHOT_MANIFEST} was taken from {manifest.key.image}, its subject is {found.subject.digest}"
        )
    referrer.check_annotation(found, LABEL_SNAPSHOT_MANIFEST, sha256_digest(data), KIND)
    return VerifiedSnapshot(
        reference=where,
        digest=found.top.digest,
        key=manifest.key,
        base_digest=found.subject.digest,
        manifest_digest=sha256_digest(data),
        signer=found.signed.signer,
        files=len(manifest.files),
        bytes=manifest.total_bytes,
        environment=manifest.environment,
    )


def is_snapshot(client: RegistryClient, reference: str) -> bool:
    """Whether ``reference`` names a snapshot artifact (by its manifest's ``artifactType``)."""
    return referrer.is_kind(client, reference, KIND)


def verify_snapshot(
    reference: str, *, base: str, policy: VerifyPolicy, client: RegistryClient | None = None
) -> VerifiedSnapshot:
    """``read_snapshot``, then what admission checks for a pod pinned to ``base``: the snapshot
    refers to it and carries its cache key."""
    client = client or RegistryClient()
    base_ref, facts = _base(client, base)
    assert base_ref.digest is not None
    verified = read_snapshot(client, reference, policy)
    if verified.base_digest != base_ref.digest:
        raise SnapshotRefused(
            f"{verified.reference}: refers to {verified.base_digest}, but the pod's image is {base_ref.digest}"
        )
    _check_base(verified.reference, verified.key, facts, base_ref.digest)
    return verified
