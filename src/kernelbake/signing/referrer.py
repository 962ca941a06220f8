"""An artifact that refers to an image by digest, as a cache delta and a process snapshot both
are: pushed, signed and attested one way (``publish``), and read back one way (``read``).

The shape: a minimal image (so that an image volume can mount it), whose last layer holds the
artifact's own manifest file alone (``delta.json``, ``snapshot.json``); its config labels say
what it is; its OCI manifest has the ``artifactType`` and the image as ``subject``, so that it is
a referrer of the image. It is signed like an image (``sign_image``, signature only) and attested
with its own predicate type. What differs between the two is a ``Kind``; what each holds and
checks stays in ``signing.delta`` and ``signing.snapshot``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any, Generic, Protocol, TypeVar

from kernelbake.errors import BadInput
from kernelbake.oci import Descriptor, Manifest, Reference, RegistryClient, parse_reference
from kernelbake.oci import types as mt
from kernelbake.oci.types import encode_json, sha256_digest
from kernelbake.remote import ImageFacts, read_image
from kernelbake.signing import intoto
from kernelbake.signing.errors import VerificationFailed, registry_errors
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.sign import push_bundle, sign_image
from kernelbake.signing.signer import Signer
from kernelbake.signing.tarstream import FileTar, entries
from kernelbake.signing.verify import VerifiedSignature, verify_signature

# A tar of one small file is this much larger than the file.
_TAR_SLACK = 64 << 10


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kind:
    """What one kind of referrer artifact is called and bounded by."""

    artifact_type: str
    manifest: str  # the file its last layer holds alone
    max_manifest_bytes: int
    predicate_type: str
    what: str  # how messages name one ("cache delta")
    layers: str  # how messages name its layers ("files, then delta.json alone")
    refused: type[VerificationFailed]
    # Tar layers one may have: two (its files, then the manifest file alone), or up to this
    # many where its files may be split over several (a snapshot's weights, a layer a file).
    max_layers: int = 2


def add_file(
    tar: tarfile.TarFile, path: str, size: int, mode: int, mtime: int, data: IO[bytes], seen: set[str]
) -> None:
    """``path`` into ``tar``, owned by root, after each directory above it not added yet."""
    for info in entries(path, size, mode, mtime, seen):
        tar.addfile(info, data if info.isfile() else None)


def manifest_tar(name: str, data: bytes) -> bytes:
    """The last layer: the artifact's manifest file alone, read-only."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_file(tar, name, len(data), 0o444, 0, io.BytesIO(data), set())
    return buf.getvalue()


def file_sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def pinned_base(client: RegistryClient, base: str, *, pinned_as: str) -> tuple[Reference, ImageFacts]:
    """The image an artifact refers to, which must be named by digest (``pinned_as`` says which
    one it must be), and what it is."""
    ref = parse_reference(base)
    if ref.digest is None:
        raise BadInput(f"{base}: the image must be pinned by digest (IMAGE@sha256:…), {pinned_as}")
    with registry_errors(ref.pinned(), missing_is_image=True):
        top = client.get_manifest(ref)
        facts = read_image(client, ref.with_digest(top.digest), top)
    return ref.with_digest(top.digest), facts


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layer:
    """A layer to push: in memory, or (``tar``) made from files as large as a model while it
    is uploaded."""

    descriptor: Descriptor
    data: bytes = b""
    tar: FileTar | None = None

    @classmethod
    def of(cls, data: bytes) -> Layer:
        return cls(descriptor=Descriptor.of(data, mt.OCI_LAYER_TAR), data=data)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Artifact:
    """One artifact to publish, referring to ``base``."""

    kind: Kind
    layers: tuple[Layer, ...]  # the last one: ``manifest_tar`` of the kind's manifest file
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    predicate: Mapping[str, Any]


def _body(artifact: Artifact, config: bytes, subject: Descriptor) -> bytes:
    doc = {
        "schemaVersion": 2,
        "mediaType": mt.OCI_MANIFEST,
        "artifactType": artifact.kind.artifact_type,
        "config": Descriptor.of(config, mt.OCI_CONFIG).to_json(),
        "layers": [layer.descriptor.to_json() for layer in artifact.layers],
        "subject": Descriptor(
            media_type=subject.media_type, digest=subject.digest, size=subject.size
        ).to_json(),
        "annotations": dict(artifact.annotations),
    }
    return encode_json(doc)


def publish(
    client: RegistryClient,
    artifact: Artifact,
    *,
    base: Reference,
    facts: ImageFacts,
    dest: Reference,
    signer: Signer,
) -> Reference:
    """Push ``artifact`` to ``dest`` as a referrer of ``base`` (also listed among the base's
    referrers where both are in one repository), sign its digest and attest its predicate;
    the artifact by digest."""
    config = encode_json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": dict(artifact.labels)},
            "rootfs": {"type": "layers", "diff_ids": [layer.descriptor.digest for layer in artifact.layers]},
        }
    )
    body = _body(artifact, config, facts.top.descriptor())
    for layer in artifact.layers:
        if (tar := layer.tar) is not None:
            client.put_blob_stream(dest, layer.descriptor.digest, layer.descriptor.size, tar.reader)
        else:
            client.put_blob(dest, layer.data)
    client.put_blob(dest, config)
    if dest.name == base.name:
        # A referrer of the base where registries look for them (the fallback index too).
        client.push_referrer(base, body, mt.OCI_MANIFEST)
    client.put_manifest(dest, body, mt.OCI_MANIFEST)
    pinned = dest.with_digest(sha256_digest(body))
    sign_image(pinned.pinned(), signer, client=client, attest=False)
    predicate_type = artifact.kind.predicate_type
    statement = signer.sign_statement(
        intoto.make_statement(pinned.name, sha256_digest(body), predicate_type, dict(artifact.predicate))
    )
    top = client.get_manifest(pinned)
    push_bundle(client, pinned, top.descriptor(), statement.bundle, predicate_type, signer)
    return pinned


@dataclasses.dataclass(frozen=True)
class Read:
    """An artifact of a kind whose signature the policy trusts, before its manifest file is read."""

    top: Manifest
    pinned: Reference
    signed: VerifiedSignature
    subject: Descriptor

    @property
    def where(self) -> str:
        return self.pinned.pinned()


class _Key(Protocol):
    @property
    def digest(self) -> str: ...


K = TypeVar("K", bound=_Key)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verified(Generic[K]):
    """What every verified artifact of a kind says: where it is, what it refers to, its key,
    who signed it and how large it is; ``signing.delta`` and ``signing.snapshot`` add their own."""

    reference: str  # host/repo@sha256:… of the artifact
    digest: str
    key: K
    base_digest: str  # the image it refers to: its subject
    manifest_digest: str  # the sha256 of its manifest file, which the pod pins
    signer: str
    files: int
    bytes: int

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


def read(client: RegistryClient, reference: str, policy: VerifyPolicy, kind: Kind) -> Read:
    """A trusted signature on the artifact's digest (junk and foreign referrers passed over, as
    for images), its ``artifactType`` and its subject. Raises ``kind.refused``."""
    ref = parse_reference(reference)
    with registry_errors(str(ref), missing_is_image=True):
        top = client.get_manifest(ref, accept=mt.IMAGE_MANIFESTS)
    pinned = ref.with_digest(top.digest)
    where = pinned.pinned()
    if ref.digest is not None and ref.digest != top.digest:
        raise kind.refused(f"{reference}: the registry served {top.digest}")
    signed = verify_signature(client, pinned, policy)
    if top.artifact_type != kind.artifact_type:
        raise kind.refused(
            f"{where}: artifactType {top.artifact_type!r} is not {kind.artifact_type}; not a {kind.what}"
        )
    if top.subject is None:
        raise kind.refused(f"{where}: no subject, so it refers to no image")
    return Read(top, pinned, signed, top.subject)


def manifest_descriptor(where: str, layers: list[Descriptor], kind: Kind) -> Descriptor:
    if not 2 <= len(layers) <= kind.max_layers or any(d.media_type != mt.OCI_LAYER_TAR for d in layers):
        count = "two" if kind.max_layers == 2 else f"2 to {kind.max_layers}"
        raise kind.refused(
            f"{where}: a {kind.what} has {count} tar layers ({kind.layers}), not {len(layers)}"
        )
    return layers[-1]


def manifest_file(client: RegistryClient, found: Read, kind: Kind) -> bytes:
    """The kind's manifest file from the artifact's last layer, bounded, and alone there."""
    where = found.where
    last = manifest_descriptor(where, found.top.layers, kind)
    limit = kind.max_manifest_bytes + _TAR_SLACK
    if last.size > limit:
        raise kind.refused(
            f"{where}: its {kind.manifest} layer is {last.size} B, more than a {kind.what}'s may be"
        )
    with registry_errors(where, missing_is_image=False):
        blob = client.get_blob(found.pinned, last.digest, max_bytes=limit)
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
            members = [m for m in tar.getmembers() if not m.isdir()]
            if len(members) != 1 or members[0].name != kind.manifest or not members[0].isreg():
                raise kind.refused(f"{where}: its last layer must hold {kind.manifest} alone")
            fh = tar.extractfile(members[0])
            return fh.read() if fh else b""
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise kind.refused(f"{where}: its last layer is not a readable tar ({exc})") from None


def check_annotation(found: Read, label: str, digest: str, kind: Kind) -> None:
    """The manifest file the OCI manifest's annotation names (if it names one) is the one read."""
    if found.top.annotations.get(label, digest) != digest:
        raise kind.refused(
            f"{found.where}: its annotation names another {kind.manifest} than its layer holds"
        )


def is_kind(client: RegistryClient, reference: str, kind: Kind) -> bool:
    """Whether ``reference`` names an artifact of ``kind`` (by its manifest's ``artifactType``)."""
    top = client.get_manifest(parse_reference(reference), accept=mt.IMAGE_MANIFESTS)
    return top.artifact_type == kind.artifact_type


def unlisted(root: Path, below: Path, listed: Iterable[str]) -> str | None:
    """The first file under ``below`` (in ``root``) that ``listed`` does not name, if any: an
    artifact pushes only what its manifest file lists."""
    names = set(listed)
    for dirpath, _dirs, files in os.walk(below):
        for name in files:
            if (rel := (Path(dirpath) / name).relative_to(root).as_posix()) not in names:
                return rel
    return None


def read_written(path: Path, kind: Kind, *, by: str) -> bytes:
    """The bytes of ``kind``'s manifest file in the directory ``path``, which the command ``by``
    wrote; one line naming that command when it cannot be read (the wrong directory, most likely)."""
    try:
        return (path / kind.manifest).read_bytes()
    except OSError as exc:
        raise BadInput(
            f"{path / kind.manifest}: cannot read ({exc.strerror}); is {path} what '{by}' wrote?"
        ) from None
