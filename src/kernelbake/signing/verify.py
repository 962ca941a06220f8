"""``verify_image``: is this image signed by someone the policy trusts, and is it what the
signed kernelbake attestation says it is?

In order, failing closed at the first problem:
1. resolve the reference to a digest once (``repo:tag@digest``: the tag must still point there);
2. find signature artifacts for that digest (bundle referrers, legacy ``.sig``/``.att`` tags),
   within the bounds of ``discover``;
3. a trusted signature (cosign's ``sign/v1`` statement or simple-signing payload) for this digest:
   any one is enough, as with cosign; the other artifacts are skipped with a note, and only when
   none satisfies does the most telling reason fail verification;
4. the image's labels rebuild a consistent compatibility key;
5. a trusted kernelbake attestation for this digest whose key equals the labels' key (any one);
6. the cache manifest in the last layer hashes to the attested digest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from kernelbake.contract.artifact import (
    ArtifactKind,
    CacheArtifactFacts,
    InvalidArtifact,
    artifact_facts,
    kind_of,
)
from kernelbake.contract.key import LABEL_KEY, CacheKey, InvalidKey
from kernelbake.contract.manifest import Manifest as CacheManifest
from kernelbake.errors import BadInput
from kernelbake.labels import check_labels
from kernelbake.oci import (
    InvalidReference,
    Manifest,
    Reference,
    RegistryClient,
    parse_reference,
)
from kernelbake.oci.types import sha256_digest
from kernelbake.remote import ImageFacts, ImageLayoutError, read_cache_manifest, read_image, top_manifest
from kernelbake.signing import intoto
from kernelbake.signing.discover import Artifact, Found, Kind, Skipped, describe_skipped, find_artifacts
from kernelbake.signing.errors import (
    CacheManifestMismatch,
    InvalidImageReference,
    InvalidSignature,
    LabelMismatch,
    MalformedSignature,
    MissingAttestation,
    NotKernelbakeImage,
    SubjectMismatch,
    TagMoved,
    Unsigned,
    UntrustedSigner,
    VerificationFailed,
    registry_errors,
)
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.predicate import BASE_NAME_LABEL, PREDICATE_TYPE, BadPredicate, KernelCachePredicate
from kernelbake.signing.trust import (
    Verified,
    verify_bundle,
    verify_legacy_attestation,
    verify_legacy_signature,
)

__all__ = [
    "Existing",
    "VerificationFailed",
    "VerifiedImage",
    "VerifiedSignature",
    "existing_signatures",
    "skipped_json",
    "verify_image",
    "verify_signature",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedImage:
    reference: str  # as given
    repository: str  # host/repo
    digest: str  # the verified manifest (or index) digest
    key: CacheKey
    manifest_digest: str  # sha256 of /opt/kernelbake/cache/manifest.json, as attested
    signer: str  # identity (issuer) or key fingerprint of the image signature
    attestation: Mapping[str, Any]  # the decoded kernelbake predicate ({} without one)
    # What is attached to the digest but was not used (junk, other signers, other digests), and why.
    skipped: tuple[Skipped, ...] = ()
    # A cache artifact's labels (engine image, command, env): signed with its config, checked
    # against its manifest and, when attested, against the attestation. None for an image.
    artifact: CacheArtifactFacts | None = None

    def pinned(self) -> str:
        return f"{self.repository}@{self.digest}"

    def skipped_note(self) -> str | None:
        """One line, ``skipped N attached artifacts: …``, or None when nothing was passed over."""
        return describe_skipped(self.skipped) if self.skipped else None

    def to_json(self) -> dict[str, Any]:
        """``kernelbake verify --json``: only ever made for a verified image."""
        return {
            "verified": True,
            "reference": self.reference,
            "repository": self.repository,
            "digest": self.digest,
            "key": str(self.key),
            "key_digest": self.key.digest,
            "cache_manifest_digest": self.manifest_digest,
            "signer": self.signer,
            "attestation": dict(self.attestation),
            "skipped": skipped_json(self.skipped),
        }


@dataclasses.dataclass(frozen=True)
class _Claim:
    """What one verified artifact says: a signature or a kernelbake attestation, for digests."""

    kind: str  # "signature" | "attestation" | "other"
    digests: tuple[str, ...]
    verified: Verified
    origin: str
    name: str  # short, for notes
    predicate: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class _Outcome:
    artifact: Artifact
    claim: _Claim | None = None
    failure: VerificationFailed | None = None


# Most telling reason first when no artifact verifies.
_FAILURE_ORDER: tuple[type[VerificationFailed], ...] = (InvalidSignature, UntrustedSigner, MalformedSignature)


def _claim(artifact: Artifact, v: Verified) -> _Claim:
    origin, name = artifact.origin, artifact.name
    if artifact.kind is Kind.LEGACY_SIGNATURE:
        digests: tuple[str, ...] = (intoto.parse_simple_signing(v.payload, source=origin),)
        return _Claim("signature", digests, v, origin, name)
    if v.payload_type != intoto.PAYLOAD_TYPE:
        raise MalformedSignature(f"{origin}: signed payloadType {v.payload_type!r} is not in-toto")
    statement = intoto.parse_statement(v.payload, source=origin)
    digests = tuple(statement.digests())
    if statement.predicate_type == intoto.COSIGN_SIGN_PREDICATE:
        return _Claim("signature", digests, v, origin, name)
    if statement.predicate_type == PREDICATE_TYPE:
        return _Claim("attestation", digests, v, origin, name, statement.predicate)
    return _Claim("other", digests, v, origin, name)


def _check(artifact: Artifact, policy: VerifyPolicy) -> _Outcome:
    """One artifact, verified and read; what it says, or why it is of no use (never raised: any
    one artifact that satisfies the policy is enough)."""
    try:
        if artifact.kind is Kind.BUNDLE:
            verified = verify_bundle(artifact.data, policy, source=artifact.origin)
        elif artifact.kind is Kind.LEGACY_SIGNATURE:
            verified = verify_legacy_signature(
                artifact.data, artifact.annotations, policy, source=artifact.origin
            )
        else:
            verified = verify_legacy_attestation(
                artifact.data, artifact.annotations, policy, source=artifact.origin
            )
        return _Outcome(artifact, claim=_claim(artifact, verified))
    except (InvalidSignature, UntrustedSigner, MalformedSignature) as exc:
        return _Outcome(artifact, failure=exc)


def _as_skipped(exc: VerificationFailed, artifact: Artifact) -> Skipped:
    # The failure's message starts with the origin already; keep the reason only.
    return Skipped(artifact.name, str(exc).removeprefix(f"{artifact.origin}: "))


def _note(skipped: Sequence[Skipped]) -> str:
    return f"; {describe_skipped(skipped, what='other')}" if skipped else ""


def _nothing_verified(
    where: str, outcomes: Sequence[_Outcome], what: str, skipped: Sequence[Skipped]
) -> VerificationFailed:
    """The most telling failure, and a note of everything else that was passed over."""
    for cls in _FAILURE_ORDER:
        for o in outcomes:
            if isinstance(o.failure, cls):
                rest = [s for s in skipped if s.origin != o.artifact.name]
                return cls(f"{where}: no trusted {what}: {o.failure}{_note(rest)}")
    if skipped:
        return Unsigned(f"{where}: no usable {what} found; {describe_skipped(skipped)}")
    return Unsigned(f"{where}: no {what} found (no bundle referrers, no .sig tag)")


def _pick(
    where: str,
    digest: str,
    claims: Sequence[_Claim],
    kind: str,
    what: str,
    outcomes: Sequence[_Outcome],
    skipped: Sequence[Skipped],
) -> list[_Claim]:
    """The trusted claims of ``kind`` for ``digest`` (at least one); otherwise the most telling
    reason why none. ``skipped``: everything passed over so far, for the message."""
    mine = [c for c in claims if c.kind == kind and digest in c.digests]
    if mine:
        return mine
    foreign = [c for c in claims if c.kind == kind]
    if foreign:
        c = foreign[0]
        raise SubjectMismatch(
            f"{where}: the trusted {what} at {c.origin} was made for {', '.join(c.digests) or 'no digest'}, "
            f"not {digest}{_note(skipped)}"
        )
    failed = [o for o in outcomes if o.failure is not None]
    if kind == "signature" and (failed or skipped or not claims):
        raise _nothing_verified(where, failed, what, skipped)
    tampered = [o for o in failed if isinstance(o.failure, InvalidSignature | MalformedSignature)]
    if tampered:
        raise _nothing_verified(where, tampered, what, skipped)
    raise (MissingAttestation if kind == "attestation" else Unsigned)(
        f"{where}: no trusted {what} for {digest}{_note(skipped)}"
    )


def _labels_key(where: str, labels: Mapping[str, str]) -> CacheKey:
    if LABEL_KEY not in labels:
        raise NotKernelbakeImage(f"{where}: no {LABEL_KEY} label; not a kernelbake image")
    try:
        checked = check_labels(labels)
    except InvalidKey as exc:
        raise LabelMismatch(f"{where}: labels are inconsistent: {exc}") from None
    if checked.problems:
        raise LabelMismatch(f"{where}: labels are inconsistent: {'; '.join(checked.problems)}")
    return checked.key


def _check_predicate(where: str, facts: ImageFacts, key: CacheKey, claim: _Claim) -> KernelCachePredicate:
    try:
        predicate = KernelCachePredicate.from_json(claim.predicate, source=claim.origin)
    except BadPredicate as exc:
        raise MalformedSignature(f"{where}: attestation predicate: {exc}") from None
    if predicate.key != key:
        differ = [n for n, v in key.as_dict().items() if predicate.key.as_dict()[n] != v]
        raise LabelMismatch(
            f"{where}: labels give key {key.digest} but the attestation says {predicate.key.digest} "
            f"(fields differ: {', '.join(differ)})"
        )
    base = facts.labels.get(BASE_NAME_LABEL)
    if predicate.base_image != base:
        raise LabelMismatch(
            f"{where}: label {BASE_NAME_LABEL}={base!r} but attested {predicate.base_image!r}"
        )
    if predicate.cache_manifest_path != facts.cache_manifest_path:
        raise LabelMismatch(
            f"{where}: attested for the cache manifest at /{predicate.cache_manifest_path}, "
            f"but this is a {kind_of(facts.labels).value} with it at /{facts.cache_manifest_path}"
        )
    if predicate.artifact != _artifact(where, facts):
        raise LabelMismatch(f"{where}: cache artifact labels differ from the attested ones")
    return predicate


def _artifact(where: str, facts: ImageFacts) -> CacheArtifactFacts | None:
    """The cache artifact facts of ``facts``' labels; None for an image."""
    try:
        if kind_of(facts.labels) is not ArtifactKind.CACHE:
            return None
        return artifact_facts(facts.labels, source=where)
    except InvalidArtifact as exc:
        raise LabelMismatch(str(exc)) from None


def _cache_manifest(
    where: str, client: RegistryClient, facts: ImageFacts, key: CacheKey
) -> tuple[str, bytes]:
    """(last layer digest, cache manifest bytes), after checking it was built for ``key`` (and,
    for a cache artifact, that it is the manifest its label names)."""
    artifact = _artifact(where, facts)
    with registry_errors(where, missing_is_image=False):
        try:
            layer, data = read_cache_manifest(client, facts)
        except ImageLayoutError as exc:
            raise CacheManifestMismatch(str(exc)) from None
    source = f"{where}: /{facts.cache_manifest_path}"
    if artifact is not None and artifact.manifest_digest != sha256_digest(data):
        raise CacheManifestMismatch(
            f"{source} hashes to {sha256_digest(data)}; the artifact's label says {artifact.manifest_digest}"
        )
    try:
        parsed = CacheManifest.from_json(data.decode("utf-8", "replace"), source=source)
    except BadInput as exc:
        raise CacheManifestMismatch(str(exc)) from None
    if parsed.key != key:
        raise CacheManifestMismatch(
            f"{source}: built for key {parsed.key.digest}, the labels say {key.digest}"
        )
    return layer.digest, data


def _check_cache_manifest(where: str, predicate: KernelCachePredicate, layer_digest: str, data: bytes) -> str:
    if layer_digest != predicate.cache_layer_digest:
        raise CacheManifestMismatch(
            f"{where}: last layer is {layer_digest}; the attestation says {predicate.cache_layer_digest}"
        )
    digest = sha256_digest(data)
    if digest != predicate.cache_manifest_digest:
        raise CacheManifestMismatch(
            f"{where}: cache manifest hashes to {digest}; the attestation says {predicate.cache_manifest_digest}"
        )
    return digest


def _resolve(client: RegistryClient, ref: Reference, given: Manifest | None) -> tuple[Reference, ImageFacts]:
    where = str(ref)
    with registry_errors(where, missing_is_image=True):
        if ref.tag and ref.digest:
            moved_to = client.resolve(Reference(ref.registry, ref.repository, tag=ref.tag))
            if moved_to != ref.digest:
                raise TagMoved(f"{where}: tag {ref.tag!r} now points to {moved_to}, not the pinned digest")
        top = top_manifest(client, ref, given)
        pinned = ref.with_digest(top.digest) if not ref.digest else ref
        try:
            facts = read_image(client, pinned, top)
        except ImageLayoutError as exc:
            raise NotKernelbakeImage(str(exc)) from None
    return pinned, facts


def _attested(
    where: str,
    client: RegistryClient,
    facts: ImageFacts,
    key: CacheKey,
    attestations: Sequence[_Claim],
    skipped: list[Skipped],
) -> tuple[_Claim, str]:
    """The first trusted attestation that describes this image (its key, base, cache manifest),
    and the cache manifest's digest; those that do not are added to ``skipped``. None: the first
    one's reason, and a note of the others."""
    cache: tuple[str, bytes] | None = None
    first: VerificationFailed | None = None
    passed_over: list[Skipped] = []
    for claim in attestations:
        try:
            predicate = _check_predicate(where, facts, key, claim)
            # The image's own cache manifest: a problem with it is no attestation's fault.
            cache = cache or _cache_manifest(where, client, facts, key)
            manifest_digest = _check_cache_manifest(where, predicate, *cache)
        except (LabelMismatch, MalformedSignature, CacheManifestMismatch) as exc:
            if cache is None and isinstance(exc, CacheManifestMismatch):
                raise
            first = first or exc
            passed_over.append(Skipped(claim.name, str(exc).removeprefix(f"{where}: ")))
            continue
        skipped += passed_over
        return claim, manifest_digest
    assert first is not None
    raise type(first)(f"{first}{_note([*passed_over[1:], *skipped])}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedSignature:
    """A digest signed by someone the policy trusts (what an image index needs: its signed bytes
    are what it lists)."""

    repository: str  # host/repo
    digest: str
    signer: str
    skipped: tuple[Skipped, ...] = ()

    def pinned(self) -> str:
        return f"{self.repository}@{self.digest}"

    def skipped_note(self) -> str | None:
        return describe_skipped(self.skipped) if self.skipped else None


def skipped_json(skipped: Sequence[Skipped]) -> list[dict[str, Any]]:
    return [{"origin": s.origin, "reason": s.reason, "count": s.count} for s in skipped]


@dataclasses.dataclass(frozen=True)
class _Signed:
    signature: _Claim
    claims: list[_Claim]
    outcomes: list[_Outcome]
    skipped: list[Skipped]


def _signed(client: RegistryClient, pinned: Reference, policy: VerifyPolicy) -> _Signed:
    """Steps 2 and 3 for ``pinned`` (a reference with its digest): the trusted signature, every
    verified claim and everything passed over so far."""
    assert pinned.digest is not None
    digest = pinned.digest
    where = f"{pinned.name}@{digest}"
    with registry_errors(where, missing_is_image=False):
        found, outcomes = _found(client, pinned, policy)
    claims = [o.claim for o in outcomes if o.claim is not None]
    # Everything passed over, the artifacts that did not verify first (the most telling).
    skipped = [_as_skipped(o.failure, o.artifact) for o in outcomes if o.failure is not None]
    skipped += found.skipped
    signature = _pick(where, digest, claims, "signature", "signature", outcomes, skipped)[0]
    skipped += [
        Skipped(c.name, f"made for {', '.join(c.digests) or 'no digest'}, not this digest")
        for c in claims
        if c.kind in ("signature", "attestation") and digest not in c.digests
    ]
    return _Signed(signature, claims, outcomes, skipped)


def _found(client: RegistryClient, pinned: Reference, policy: VerifyPolicy) -> tuple[Found, list[_Outcome]]:
    """What is attached to ``pinned.digest``, found as the policy's signers vouch for it (its
    keys and identities), each artifact checked against the policy."""
    found = find_artifacts(
        client,
        pinned,
        prefer=(intoto.COSIGN_SIGN_PREDICATE, PREDICATE_TYPE),
        vouchers=policy.keys,
        identities=policy.identities,
        trusted_root=policy.trusted_root,
    )
    return found, [_check(a, policy) for a in found.artifacts]


def verify_signature(client: RegistryClient, pinned: Reference, policy: VerifyPolicy) -> VerifiedSignature:
    """The signature check of ``verify_image`` alone, for a digest (``pinned.digest`` must be
    set; its content is not read): any attached signature that satisfies the policy is enough,
    junk and other signers' artifacts are skipped with a note. Raises a ``VerificationFailed``
    subclass."""
    if pinned.digest is None:
        raise InvalidImageReference(f"{pinned}: verify_signature needs a digest")
    signed = _signed(client, pinned, policy)
    return VerifiedSignature(
        repository=pinned.name,
        digest=pinned.digest,
        signer=signed.signature.verified.signer,
        skipped=tuple(signed.skipped),
    )


@dataclasses.dataclass(frozen=True)
class Existing:
    """What the policy's signers have already attached to one digest, by format: signing the
    same digest again with the same key can then be skipped."""

    signature: bool = False  # a cosign sign/v1 bundle
    legacy_signature: bool = False  # a .sig layer
    attestations: tuple[Mapping[str, Any], ...] = ()  # kernelbake predicates, in bundles
    legacy_attestations: tuple[Mapping[str, Any], ...] = ()  # and in .att layers


def existing_signatures(client: RegistryClient, pinned: Reference, policy: VerifyPolicy) -> Existing:
    """The signatures and attestations attached to ``pinned.digest`` that verify under
    ``policy``, found and checked as ``verify_image`` does (within the same bounds); junk and
    other signers' artifacts are passed over."""
    assert pinned.digest is not None
    outcomes = _found(client, pinned, policy)[1]
    mine = [
        (o.artifact.kind, o.claim)
        for o in outcomes
        if o.claim is not None and pinned.digest in o.claim.digests
    ]
    legacy = (Kind.LEGACY_SIGNATURE, Kind.LEGACY_ATTESTATION)
    return Existing(
        signature=any(k is Kind.BUNDLE and c.kind == "signature" for k, c in mine),
        legacy_signature=any(k is Kind.LEGACY_SIGNATURE and c.kind == "signature" for k, c in mine),
        attestations=tuple(c.predicate for k, c in mine if k is Kind.BUNDLE and c.kind == "attestation"),
        legacy_attestations=tuple(c.predicate for k, c in mine if k in legacy and c.kind == "attestation"),
    )


def verify_image(
    reference: str,
    policy: VerifyPolicy,
    *,
    client: RegistryClient | None = None,
    top: Manifest | None = None,
) -> VerifiedImage:
    """Verify ``reference`` (``host/repo:tag``, ``host/repo@sha256:…`` or both) against ``policy``.

    Any attached signature (bundle or legacy tag) that satisfies the policy is enough, as with
    cosign; the rest are skipped and listed in ``VerifiedImage.skipped``. Raises a
    ``VerificationFailed`` subclass for every failure, a malformed reference included
    (``InvalidImageReference``, also a ``BadInput``); returns only when every check passed.

    ``top``: the manifest ``reference`` names, when the caller has read it already
    (``fleet.read_top``), so that a tag is read once; every check is made against it.
    """
    if not isinstance(policy, VerifyPolicy):
        raise TypeError(
            "verify_image: policy must be a VerifyPolicy (load_policy or VerifyPolicy.from_mapping)"
        )
    try:
        ref = parse_reference(reference)
    except InvalidReference as exc:
        raise InvalidImageReference(str(exc)) from None
    client = client or RegistryClient()
    pinned, facts = _resolve(client, ref, top)
    digest = facts.top.digest
    where = f"{pinned.name}@{digest}"
    signed = _signed(client, pinned.with_digest(digest), policy)
    signature, claims, outcomes, skipped = signed.signature, signed.claims, signed.outcomes, signed.skipped

    key = _labels_key(where, facts.labels)
    attested: dict[str, Any] = {}
    if not policy.require_attestation and not any(c.kind == "attestation" for c in claims):
        _, data = _cache_manifest(where, client, facts, key)
        manifest_digest = sha256_digest(data)
    else:
        mine = _pick(where, digest, claims, "attestation", "kernelbake attestation", outcomes, skipped)
        attestation, manifest_digest = _attested(where, client, facts, key, mine, skipped)
        attested = dict(attestation.predicate)
    return VerifiedImage(
        reference=reference,
        repository=pinned.name,
        digest=digest,
        key=key,
        manifest_digest=manifest_digest,
        signer=signature.verified.signer,
        attestation=attested,
        skipped=tuple(skipped),
        artifact=_artifact(where, facts),
    )
