"""A cache delta as an OCI artifact: pushed layered on its base image, signed, attested; and
verified as admission must before a pod may mount it.

The artifact is a minimal image (so that an image volume can mount it at ``DELTA_ROOT``):
one layer with the files at their bundle-relative paths, then a layer holding ``delta.json``
alone; its config labels carry the key (``CacheKey.labels``) and the delta's facts; the
manifest has ``artifactType`` ``ARTIFACT_TYPE`` and ``subject`` = the base image, so it is a
referrer of it. It is signed by the same path as images (``sign_image``, signature only) and
attested with a ``DELTA_PREDICATE_TYPE`` statement: which replica, which base, which key, and
where the bytes come from (``origin``: rebuilt by which builder from which record, or the
replica's own). Only a rebuilt delta is pushed unless ``unsafe_replica_bytes`` is given; the tag
by default names the base's digest, so deltas of two bases never overwrite each other.

``verify_delta`` takes nothing from the registry on trust: a signature the policy accepts
(junk and foreign referrers are passed over, as for images), then the manifest's subject, the
delta manifest's own base and key against the base image's labels and pinned cache manifest.
A delta of the replica's own bytes is refused unless the policy sets ``unsafe_replica_deltas``.
"""

from __future__ import annotations

import dataclasses
import io
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelbake.contract.artifact import LABEL_ARTIFACT
from kernelbake.contract.delta import (
    ARTIFACT_TYPE,
    DELTA_MANIFEST,
    MAX_MANIFEST_BYTES,
    DeltaManifest,
    InvalidDelta,
    Layering,
    Origin,
    base_problems,
)
from kernelbake.contract.key import LABEL_NS, CacheKey, key_from_labels
from kernelbake.contract.manifest import Manifest as CacheManifest
from kernelbake.errors import BadInput
from kernelbake.oci import Reference, RegistryClient, fallback_tag, parse_reference
from kernelbake.oci.types import sha256_digest
from kernelbake.remote import ImageFacts, read_cache_manifest
from kernelbake.signing import referrer
from kernelbake.signing.errors import DeltaRefused, registry_errors
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.signer import Signer

DELTA_PREDICATE_TYPE = "https://kernelbake.dev/attestation/cache-delta/v1"
DELTA_ARTIFACT = "cache-delta/v1"
LABEL_DELTA_BASE = f"{LABEL_NS}.delta.base"
LABEL_DELTA_MANIFEST = f"{LABEL_NS}.delta.manifest-digest"
ANN_DELTA_BASE = LABEL_DELTA_BASE
# The default tag: one per base digest (``delta-sha256-<hex>``).
TAG_PREFIX = "delta-"
# The policy setting that lets a replica's own bytes through, named in every refusal.
UNSAFE_SETTING = "verify.unsafe_replica_deltas"
KIND = referrer.Kind(
    artifact_type=ARTIFACT_TYPE,
    manifest=DELTA_MANIFEST,
    max_manifest_bytes=MAX_MANIFEST_BYTES,
    predicate_type=DELTA_PREDICATE_TYPE,
    what="cache delta",
    layers=f"files, then {DELTA_MANIFEST} alone",
    refused=DeltaRefused,
)


def _hash_beneath(root: Path, rel: str) -> tuple[int, str, int, int]:
    """(size, sha256, mode, mtime) of the regular file ``rel`` under ``root``, no part of it a
    symlink: the directory is what ``capture collect`` wrote, but it travelled (docker cp)."""
    p = root
    for part in rel.split("/"):
        p = p / part
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            raise BadInput(f"{root / rel}: {p} is a symlink; a delta holds plain files only")
    if not stat.S_ISREG(st.st_mode):
        raise BadInput(f"{root / rel}: not a regular file")
    return st.st_size, referrer.file_sha256(p), stat.S_IMODE(st.st_mode), int(st.st_mtime)


def _tar(entries: list[tuple[str, bytes, int, int]]) -> bytes:
    """An uncompressed, ordered tar of (path, bytes, mode, mtime), owned by root."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        seen: set[str] = set()
        for path, data, mode, mtime in entries:
            referrer.add_file(tar, path, len(data), (mode & 0o777) | 0o444, mtime, io.BytesIO(data), seen)
    return buf.getvalue()


def load_dir(path: Path) -> tuple[DeltaManifest, list[tuple[str, bytes, int, int]]]:
    """What ``capture collect`` wrote, every file checked against delta.json."""
    text = referrer.read_written(path, KIND, by="kernelbake capture collect")
    delta = DeltaManifest.from_json(text, source=str(path / DELTA_MANIFEST))
    entries = []
    for f in delta.files:
        try:
            size, sha, mode, mtime = _hash_beneath(path, f.path)
        except FileNotFoundError:
            raise BadInput(f"{path / f.path}: missing, but delta.json lists it") from None
        if (size, sha) != (f.size, f.sha256):
            raise BadInput(
                f"{path / f.path}: sha256 {sha} ({size} B), delta.json records {f.sha256} ({f.size} B)"
            )
        entries.append((f.path, (path / f.path).read_bytes(), mode, mtime))
    if rel := referrer.unlisted(path, path, [*(f.path for f in delta.files), DELTA_MANIFEST]):
        raise BadInput(f"{path / rel}: not listed in delta.json; a delta pushes only what it lists")
    return delta, entries


@dataclasses.dataclass(frozen=True, kw_only=True)
class PushedDelta:
    reference: str  # host/repo@sha256:… of the delta artifact
    tagged: str  # host/repo:tag it was pushed to
    base: str  # host/repo@sha256:… of the base image
    manifest_digest: str  # sha256 of delta.json: what $KERNELBAKE_DELTA_DIGEST pins
    files: int
    bytes: int
    signer: str
    replica: str
    origin: str
    builder: str  # who rebuilt it; "" for a replica's bytes

    def describe(self) -> str:
        where = (
            f"rebuilt by {self.builder}"
            if self.origin == Origin.REBUILT.value
            else f"UNSAFE: the bytes replica {self.replica or '(unnamed)'} wrote, not rebuilt"
        )
        return (
            f"pushed delta {self.reference} ({self.files} files, {self.bytes} B, {where}) layered on "
            f"{self.base}, signed and attested by {self.signer}; delta.json {self.manifest_digest}"
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _base(client: RegistryClient, base: str) -> tuple[Reference, ImageFacts, bytes]:
    """The base image pinned by digest, its facts and its cache manifest's bytes."""
    ref, facts = referrer.pinned_base(client, base, pinned_as="the one the replica ran")
    with registry_errors(ref.pinned(), missing_is_image=True):
        _layer, cache_manifest = read_cache_manifest(client, facts)
    return ref, facts, cache_manifest


def _check_base(
    where: str, delta: DeltaManifest, facts: Any, cache_manifest: bytes, base: str, named: str
) -> None:
    """The delta belongs on this base (``contract.delta.base_problems``)."""
    baked = CacheManifest.from_json(cache_manifest.decode(errors="replace"), source=f"{base}: manifest")
    image = Layering(
        key=key_from_labels(facts.labels),
        manifest=sha256_digest(cache_manifest),
        image=base,
        files={f.path: f.sha256 for f in baked.files},
    )
    if problems := base_problems(Layering.of(delta), image, named=named):
        raise DeltaRefused(f"{where}: {'; '.join(problems)}")


def push_delta(
    path: Path,
    *,
    base: str,
    signer: Signer,
    to: str | None = None,
    replica: str | None = None,
    client: RegistryClient | None = None,
    unsafe_replica_bytes: bool = False,
) -> PushedDelta:
    """Push the delta in ``path`` layered on ``base`` (``IMAGE@sha256:…``), then sign and attest
    it. Everything is checked before the first byte is pushed."""
    client = client or RegistryClient()
    delta, entries = load_dir(path)
    _pushable(path, delta, unsafe_replica_bytes=unsafe_replica_bytes)
    base_ref, facts, cache_manifest = _base(client, base)
    assert base_ref.digest is not None
    _check_base(str(path), delta, facts, cache_manifest, base_ref.digest, "the base image")
    if delta.rebuild is not None and delta.rebuild.image != base_ref.digest:
        raise DeltaRefused(
            f"{path}: rebuilt from the image {delta.rebuild.image}, not the base {base_ref.digest}; "
            "push it layered on the image it was rebuilt from"
        )
    delta = delta.with_base(base_ref.digest)
    if replica is not None:
        delta = dataclasses.replace(delta, replica=replica)
    dest = parse_reference(to) if to else base_ref.with_tag(default_tag(base_ref.digest))
    if dest.tag is None:
        raise BadInput(f"{to}: expected REPO:TAG to push the delta to")
    artifact = _artifact(delta, entries, base_ref, signer)
    pinned = referrer.publish(client, artifact, base=base_ref, facts=facts, dest=dest, signer=signer)
    return PushedDelta(
        reference=pinned.pinned(),
        tagged=f"{dest.name}:{dest.tag}",
        base=base_ref.pinned(),
        manifest_digest=sha256_digest(delta.to_json().encode()),
        files=len(delta.files),
        bytes=delta.total_bytes,
        signer=signer.identity,
        replica=delta.replica,
        origin=delta.origin.value,
        builder=delta.rebuild.builder if delta.rebuild else "",
    )


def _pushable(path: Path, delta: DeltaManifest, *, unsafe_replica_bytes: bool) -> None:
    if not delta.files:
        raise BadInput(f"{path}: the delta lists no files; there is nothing to push")
    if delta.origin is Origin.REPLICA and not unsafe_replica_bytes:
        raise BadInput(
            f"{path}: holds the bytes a replica wrote (origin replica), which anything that could write its "
            "cache root chose; record in the replica ('kernelbake capture record') and push what "
            "'kernelbake capture rebuild' compiles, or pass --unsafe-replica-bytes (refused by a policy "
            f"without {UNSAFE_SETTING})"
        )


def _artifact(
    delta: DeltaManifest, entries: list[tuple[str, bytes, int, int]], base: Reference, signer: Signer
) -> referrer.Artifact:
    """The delta as the artifact pushed: its files, then delta.json alone."""
    data = delta.to_json().encode()
    assert base.digest is not None
    return referrer.Artifact(
        kind=KIND,
        layers=(
            referrer.Layer.of(_tar(entries)),
            referrer.Layer.of(referrer.manifest_tar(DELTA_MANIFEST, data)),
        ),
        labels={
            **delta.key.labels(),
            LABEL_ARTIFACT: DELTA_ARTIFACT,
            LABEL_DELTA_BASE: base.digest,
            LABEL_DELTA_MANIFEST: sha256_digest(data),
        },
        annotations={ANN_DELTA_BASE: base.digest, LABEL_DELTA_MANIFEST: sha256_digest(data)},
        predicate={
            "replica": delta.replica,
            "baseImage": {"name": base.name, "digest": base.digest},
            "key": str(delta.key),
            "keyDigest": delta.key.digest,
            "signer": signer.identity,
            "deltaManifest": {"path": "/" + DELTA_MANIFEST, "digest": sha256_digest(data)},
            "kinds": delta.totals(),
            "origin": delta.origin.value,
            "rebuild": delta.rebuild.to_json() if delta.rebuild else None,
        },
    )


def default_tag(base_digest: str) -> str:
    """``delta-sha256-<hex>``: a tag per base, so that a delta for one base never replaces another's."""
    return TAG_PREFIX + fallback_tag(base_digest)


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedDelta(referrer.Verified[CacheKey]):
    """A delta whose signature the policy trusts, shaped as kernelbake pushes one; what it is
    layered on (``base_digest``, ``base_manifest``) is for the caller to compare with the pod's
    image (``verify_delta`` here, ``admission.deltas`` in a review). ``manifest_digest`` is what
    $KERNELBAKE_DELTA_DIGEST must be."""

    base_manifest: str  # the base image's pinned cache manifest
    origin: str = Origin.REPLICA.value  # what delta.json says; unsaid is a replica's
    builder: str = ""  # who rebuilt it; "" for a replica's bytes
    skipped: tuple[str, ...] = ()

    def provenance(self) -> str:
        if self.origin == Origin.REBUILT.value:
            return f"rebuilt by {self.builder}"
        return f"UNSAFE: replica-signed bytes, not rebuilt, accepted only because the policy sets {UNSAFE_SETTING}"

    def describe(self) -> str:
        return (
            f"verified delta {self.reference}: signed by {self.signer}; {self.provenance()}; layered on "
            f"{self.base_digest}; key {self.key.digest}; {self.files} files ({self.bytes} B); "
            f"delta.json {self.manifest_digest}"
        )

    def to_json(self) -> dict[str, Any]:
        mine = {"base_manifest": self.base_manifest, "origin": self.origin, "builder": self.builder}
        return {**super().to_json(), **mine, "skipped": list(self.skipped)}


def is_delta(client: RegistryClient, reference: str) -> bool:
    """Whether ``reference`` names a cache delta (by its manifest's ``artifactType``)."""
    return referrer.is_kind(client, reference, KIND)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeltaFacts:
    """What a verification keeps of delta.json: its digest and summary, not its entries (a
    100,000-file delta.json is some 70 MiB of objects while it is parsed)."""

    manifest_digest: str
    key: CacheKey
    base_image: str | None
    base_manifest: str
    files: int
    bytes: int
    origin: Origin
    replica: str
    builder: str  # the rebuild's builder; "" for a replica's own bytes


# (the delta.json layer's digest and size, the read that fetches and parses it) -> its facts.
# The default runs the read; admission shares one read per digest between the names a blob is
# copied under and bounds the reads a pod runs at once (``admission.delta_reads``).
ParseOnce = Callable[[str, int, Callable[[], DeltaFacts]], DeltaFacts]


def _each_time(digest: str, size: int, read: Callable[[], DeltaFacts]) -> DeltaFacts:
    return read()


def read_delta(
    client: RegistryClient, reference: str, policy: VerifyPolicy, *, parse: ParseOnce = _each_time
) -> VerifiedDelta:
    """A trusted signature on the delta's digest and its shape (``_read``)."""
    return _read(client, reference, policy, parse)[0]


def _read(
    client: RegistryClient, reference: str, policy: VerifyPolicy, parse: ParseOnce = _each_time
) -> tuple[VerifiedDelta, DeltaManifest | None]:
    """A trusted signature on the delta's digest, its ``artifactType`` and its two layers
    (``referrer.read``), delta.json that names the manifest's subject as its base, and a
    rebuilt delta unless the policy lets a replica's bytes through. Raises a
    ``VerificationFailed`` subclass."""
    found = referrer.read(client, reference, policy, KIND)
    where, subject = found.where, found.subject
    layer = referrer.manifest_descriptor(where, found.top.layers, KIND)
    parsed: list[DeltaManifest] = []

    def read() -> DeltaFacts:
        delta, facts = _facts(where, referrer.manifest_file(client, found, KIND))
        parsed.append(delta)
        return facts

    # The layer's digest names its bytes (get_blob checks them), so its facts are the same
    # under every name the blob is copied to.
    facts = parse(layer.digest, layer.size, read)
    if facts.base_image != subject.digest:
        raise DeltaRefused(
            f"{where}: {DELTA_MANIFEST} names the base {facts.base_image}, its subject is {subject.digest}"
        )
    referrer.check_annotation(found, LABEL_DELTA_MANIFEST, facts.manifest_digest, KIND)
    if facts.origin is Origin.REPLICA and not policy.unsafe_replica_deltas:
        raise DeltaRefused(
            f"{where}: signed by {found.signed.signer} as replica {facts.replica or '(unnamed)'} wrote it "
            f"(origin replica), not rebuilt by a trusted build; this policy accepts rebuilt deltas only: "
            f"rebuild it ('kernelbake capture rebuild'), or set {UNSAFE_SETTING}: true to run a replica's bytes"
        )
    verified = VerifiedDelta(
        reference=where,
        digest=found.top.digest,
        key=facts.key,
        base_digest=subject.digest,
        base_manifest=facts.base_manifest,
        manifest_digest=facts.manifest_digest,
        signer=found.signed.signer,
        files=facts.files,
        bytes=facts.bytes,
        origin=facts.origin.value,
        builder=facts.builder,
        skipped=tuple(f"{s.origin}: {s.reason}" for s in found.signed.skipped),
    )
    return verified, (parsed[0] if parsed else None)


def _facts(where: str, data: bytes) -> tuple[DeltaManifest, DeltaFacts]:
    try:
        delta = DeltaManifest.from_json(data, source=f"{where}: {DELTA_MANIFEST}")
    except InvalidDelta as exc:
        raise DeltaRefused(str(exc)) from None
    return delta, DeltaFacts(
        manifest_digest=sha256_digest(data),
        key=delta.key,
        base_image=delta.base_image,
        base_manifest=delta.base_manifest,
        files=len(delta.files),
        bytes=delta.total_bytes,
        origin=delta.origin,
        replica=delta.replica,
        builder=delta.rebuild.builder if delta.rebuild else "",
    )


def verify_delta(
    reference: str, *, base: str, policy: VerifyPolicy, client: RegistryClient | None = None
) -> VerifiedDelta:
    """``read_delta``, then what admission checks for a pod pinned to ``base``: the delta is
    layered on it, with its key, on its pinned bundle, and gives no baked file other bytes."""
    client = client or RegistryClient()
    base_ref, facts, cache_manifest = _base(client, base)
    assert base_ref.digest is not None
    verified, delta = _read(client, reference, policy)
    assert delta is not None  # read each time by default
    _check_base(verified.reference, delta, facts, cache_manifest, base_ref.digest, "the pod's image")
    return verified
