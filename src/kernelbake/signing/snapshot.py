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
one tar layer with ``images/`` (CRIU's files, the engine log), then a layer holding
``snapshot.json`` alone; config labels carry the image's cache key labels and the snapshot
key's digest; ``artifactType`` ``ARTIFACT_TYPE``, ``subject`` the image. Signed like images
(``sign_image``, signature only), attested with a ``SNAPSHOT_PREDICATE_TYPE`` statement.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import stat
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernelbake.contract.artifact import LABEL_ARTIFACT
from kernelbake.contract.key import LABEL_NS, key_from_labels
from kernelbake.contract.snapshot import (
    ARTIFACT_TYPE,
    IMAGES_DIR,
    MAX_MANIFEST_BYTES,
    SNAPSHOT_MANIFEST,
    InvalidSnapshot,
    SnapshotKey,
    SnapshotManifest,
)
from kernelbake.errors import BadInput
from kernelbake.oci import Descriptor, Reference, RegistryClient, parse_reference
from kernelbake.oci import types as mt
from kernelbake.oci.types import encode_json, sha256_digest
from kernelbake.remote import read_image
from kernelbake.signing import intoto
from kernelbake.signing.errors import SnapshotRefused, registry_errors
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.sign import push_bundle, sign_image
from kernelbake.signing.signer import Signer
from kernelbake.signing.verify import verify_signature

SNAPSHOT_PREDICATE_TYPE = "https://kernelbake.dev/attestation/snapshot/v1"
SNAPSHOT_ARTIFACT = "snapshot/v1"
LABEL_SNAPSHOT_KEY = f"{LABEL_NS}.snapshot.key-digest"
LABEL_SNAPSHOT_MANIFEST = f"{LABEL_NS}.snapshot.manifest-digest"
TAG_SUFFIX = "-snapshot"


def load_dir(path: Path) -> tuple[SnapshotManifest, bytes]:
    """What ``snapshot take`` wrote, every file checked against snapshot.json (sizes and
    sha256), nothing unlisted: a snapshot that changed on its way here is not pushed."""
    try:
        data = (path / SNAPSHOT_MANIFEST).read_bytes()
    except OSError as exc:
        raise BadInput(
            f"{path / SNAPSHOT_MANIFEST}: cannot read ({exc.strerror}); is {path} what 'kernelbake snapshot take' wrote?"
        ) from None
    manifest = SnapshotManifest.from_json(data, source=str(path / SNAPSHOT_MANIFEST))
    listed = {f.path: f for f in manifest.files}
    for dirpath, _dirs, names in os.walk(path / IMAGES_DIR):
        for name in names:
            rel = (Path(dirpath) / name).relative_to(path).as_posix()
            if rel not in listed:
                raise BadInput(
                    f"{path / rel}: not listed in {SNAPSHOT_MANIFEST}; a snapshot pushes only what it lists"
                )
    for f in manifest.files:
        p = path / f.path
        st = p.lstat() if p.exists() or p.is_symlink() else None
        if st is None or not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{p}: missing or not a plain file, but {SNAPSHOT_MANIFEST} lists it")
        h = hashlib.sha256()
        with p.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        if (st.st_size, h.hexdigest()) != (f.size, f.sha256):
            raise BadInput(
                f"{p}: sha256 {h.hexdigest()} ({st.st_size} B), {SNAPSHOT_MANIFEST} records {f.sha256}"
            )
    return manifest, data


def _tar_to(dest: Path, root: Path, manifest: SnapshotManifest) -> str:
    """The images layer, written to ``dest`` (a snapshot is as large as the model); its sha256."""
    with dest.open("wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for f in manifest.files:
            parts = f.path.split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                    tar.addfile(info)
            info = tarfile.TarInfo(f.path)
            info.size, info.mode, info.mtime = f.size, 0o444, 0
            with (root / f.path).open("rb") as fh:
                tar.addfile(info, fh)
    h = hashlib.sha256()
    with dest.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _manifest_tar(data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(SNAPSHOT_MANIFEST)
        info.size, info.mode, info.mtime = len(data), 0o444, 0
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


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


def _base(client: RegistryClient, base: str) -> tuple[Reference, Any]:
    ref = parse_reference(base)
    if ref.digest is None:
        raise BadInput(
            f"{base}: the image must be pinned by digest (IMAGE@sha256:…), the one the snapshot was taken from"
        )
    with registry_errors(ref.pinned(), missing_is_image=True):
        top = client.get_manifest(ref)
        facts = read_image(client, ref.with_digest(top.digest), top)
    return ref.with_digest(top.digest), facts


def _check_base(where: str, key: SnapshotKey, facts: Any, base_digest: str) -> None:
    if key.image != base_digest:
        raise SnapshotRefused(f"{where}: taken from image {key.image}, not {base_digest}")
    image_key = key_from_labels(facts.labels)
    if key.cache_key != image_key:
        raise SnapshotRefused(
            f"{where}: the snapshot's cache key is {key.cache_key.digest}, the image's is {image_key.digest}"
        )


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
    dest = parse_reference(to) if to else base_ref.with_tag(f"{base_ref.tag or 'image'}{TAG_SUFFIX}")
    if dest.tag is None:
        raise BadInput(f"{to}: expected REPO:TAG to push the snapshot to")
    meta = _manifest_tar(data)
    with tempfile.TemporaryDirectory(prefix="kernelbake-snapshot-push-") as tmp:
        layer = Path(tmp) / "images.tar"
        layer_digest = _tar_to(layer, path, manifest)
        layers = [
            Descriptor(media_type=mt.OCI_LAYER_TAR, digest=layer_digest, size=layer.stat().st_size),
            Descriptor.of(meta, mt.OCI_LAYER_TAR),
        ]
        labels = {
            **manifest.key.cache_key.labels(),
            LABEL_ARTIFACT: SNAPSHOT_ARTIFACT,
            LABEL_SNAPSHOT_KEY: manifest.key.digest,
            LABEL_SNAPSHOT_MANIFEST: sha256_digest(data),
        }
        config = encode_json(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {"Labels": labels},
                "rootfs": {"type": "layers", "diff_ids": [d.digest for d in layers]},
            }
        )
        config_desc = Descriptor.of(config, mt.OCI_CONFIG)
        subject = facts.top.descriptor()
        doc = {
            "schemaVersion": 2,
            "mediaType": mt.OCI_MANIFEST,
            "artifactType": ARTIFACT_TYPE,
            "config": config_desc.to_json(),
            "layers": [d.to_json() for d in layers],
            "subject": Descriptor(
                media_type=subject.media_type, digest=subject.digest, size=subject.size
            ).to_json(),
            "annotations": {
                LABEL_SNAPSHOT_MANIFEST: sha256_digest(data),
                LABEL_SNAPSHOT_KEY: manifest.key.digest,
            },
        }
        body = encode_json(doc)
        client.put_blob_file(dest, layer, layer_digest)
    client.put_blob(dest, meta)
    client.put_blob(dest, config)
    if dest.name == base_ref.name:
        client.push_referrer(base_ref, body, mt.OCI_MANIFEST)
    client.put_manifest(dest, body, mt.OCI_MANIFEST)
    digest = sha256_digest(body)
    pinned = dest.with_digest(digest)
    sign_image(pinned.pinned(), signer, client=client, attest=False)
    predicate = {
        "baseImage": {"name": base_ref.name, "digest": base_ref.digest},
        "snapshotKey": str(manifest.key),
        "keyDigest": manifest.key.digest,
        "cacheKeyDigest": manifest.key.cache_key.digest,
        "snapshotManifest": {"path": "/" + SNAPSHOT_MANIFEST, "digest": sha256_digest(data)},
        "files": len(manifest.files),
        "bytes": manifest.total_bytes,
        "taken": dict(manifest.taken),
        "signer": signer.identity,
    }
    statement = signer.sign_statement(
        intoto.make_statement(pinned.name, digest, SNAPSHOT_PREDICATE_TYPE, predicate)
    )
    top = client.get_manifest(pinned)
    push_bundle(client, pinned, top.descriptor(), statement.bundle, SNAPSHOT_PREDICATE_TYPE, signer)
    return PushedSnapshot(
        reference=pinned.pinned(),
        base=base_ref.pinned(),
        manifest_digest=sha256_digest(data),
        key_digest=manifest.key.digest,
        files=len(manifest.files),
        bytes=manifest.total_bytes,
        signer=signer.identity,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedSnapshot:
    reference: str
    digest: str
    key: SnapshotKey
    base_digest: str  # the image it refers to (its subject, and the key's image)
    manifest_digest: str  # what $KERNELBAKE_SNAPSHOT_DIGEST must be
    signer: str
    files: int
    bytes: int
    # snapshot.json's record of the environment its key digests (None before it was recorded).
    environment: Mapping[str, str] | None = None

    def describe(self) -> str:
        return (
            f"verified snapshot {self.reference}: signed by {self.signer}; refers to {self.base_digest}; "
            f"key {self.key.digest}; {self.files} files ({self.bytes} B); snapshot.json {self.manifest_digest}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "digest": self.digest,
            "key": str(self.key),
            "key_digest": self.key.digest,
            "base_digest": self.base_digest,
            "manifest_digest": self.manifest_digest,
            "signer": self.signer,
            "files": self.files,
            "bytes": self.bytes,
            "verified": True,
        }


def _manifest_layer(client: RegistryClient, pinned: Reference, layers: list[Descriptor]) -> bytes:
    where = pinned.pinned()
    if len(layers) != 2 or any(d.media_type != mt.OCI_LAYER_TAR for d in layers):
        raise SnapshotRefused(
            f"{where}: a snapshot has two tar layers (images, then {SNAPSHOT_MANIFEST} alone)"
        )
    limit = MAX_MANIFEST_BYTES + (64 << 10)
    if layers[-1].size > limit:
        raise SnapshotRefused(
            f"{where}: its {SNAPSHOT_MANIFEST} layer is {layers[-1].size} B, more than one may be"
        )
    blob = client.get_blob(pinned, layers[-1].digest, max_bytes=limit)
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
            members = [m for m in tar.getmembers() if not m.isdir()]
            if len(members) != 1 or members[0].name != SNAPSHOT_MANIFEST or not members[0].isreg():
                raise SnapshotRefused(f"{where}: its last layer must hold {SNAPSHOT_MANIFEST} alone")
            fh = tar.extractfile(members[0])
            return fh.read() if fh else b""
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise SnapshotRefused(f"{where}: its last layer is not a readable tar ({exc})") from None


def read_snapshot(client: RegistryClient, reference: str, policy: VerifyPolicy) -> VerifiedSnapshot:
    """A trusted signature on the artifact's digest, its ``artifactType``, its two layers and a
    snapshot.json whose key names the manifest's subject as its image. Raises a
    ``VerificationFailed`` subclass."""
    ref = parse_reference(reference)
    with registry_errors(str(ref), missing_is_image=True):
        top = client.get_manifest(ref, accept=mt.IMAGE_MANIFESTS)
    pinned = ref.with_digest(top.digest)
    where = pinned.pinned()
    if ref.digest is not None and ref.digest != top.digest:
        raise SnapshotRefused(f"{reference}: the registry served {top.digest}")
    signed = verify_signature(client, pinned, policy)
    if top.artifact_type != ARTIFACT_TYPE:
        raise SnapshotRefused(
            f"{where}: artifactType {top.artifact_type!r} is not {ARTIFACT_TYPE}; not a snapshot"
        )
    if top.subject is None:
        raise SnapshotRefused(f"{where}: no subject, so not taken from any image")
    with registry_errors(where, missing_is_image=False):
        data = _manifest_layer(client, pinned, top.layers)
    try:
        manifest = SnapshotManifest.from_json(data, source=f"{where}: {SNAPSHOT_MANIFEST}")
    except InvalidSnapshot as exc:
        raise SnapshotRefused(str(exc)) from None
    if manifest.key.image != top.subject.digest:
        raise SnapshotRefused(
            f"{where}: {SNAPSHOT_MANIFEST} was taken from {manifest.key.image}, its subject is {top.subject.digest}"
        )
    found = sha256_digest(data)
    if top.annotations.get(LABEL_SNAPSHOT_MANIFEST, found) != found:
        raise SnapshotRefused(
            f"{where}: its annotation names another {SNAPSHOT_MANIFEST} than its layer holds"
        )
    return VerifiedSnapshot(
        reference=where,
        digest=top.digest,
        key=manifest.key,
        base_digest=top.subject.digest,
        manifest_digest=found,
        signer=signed.signer,
        files=len(manifest.files),
        bytes=manifest.total_bytes,
        environment=manifest.environment,
    )


def is_snapshot(client: RegistryClient, reference: str) -> bool:
    """Whether ``reference`` names a snapshot artifact (by its manifest's ``artifactType``)."""
    top = client.get_manifest(parse_reference(reference), accept=mt.IMAGE_MANIFESTS)
    return top.artifact_type == ARTIFACT_TYPE


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
