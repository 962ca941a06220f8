"""``verify_image``: is this image signed by someone the policy trusts, and is it what the
signed kernelbake attestation says it is?

In order, failing closed at the first problem:
1. resolve the reference to a digest once (``repo:tag@digest``: the tag must still point there);
2. find signature artifacts for that digest (bundle referrers, legacy ``.sig``/``.att`` tags);
3. a trusted signature (cosign's ``sign/v1`` statement or simple-signing payload) for this digest;
4. the image's labels rebuild a consistent compatibility key;
5. a trusted kernelbake attestation for this digest whose key equals the labels' key;
6. the cache manifest in the last layer hashes to the attested digest.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from kernelbake.contract.key import LABEL_KEY, CacheKey, InvalidKey, key_from_labels
from kernelbake.contract.layout import CACHE_MANIFEST_PATH
from kernelbake.contract.manifest import Manifest as CacheManifest
from kernelbake.errors import BadInput
from kernelbake.oci import (
    InvalidReference,
    Reference,
    RegistryClient,
    RegistryDenied,
    RegistryNotFound,
    RegistryProtocolError,
    RegistryServerError,
    RegistryUnreachable,
    parse_reference,
)
from kernelbake.oci.types import sha256_digest
from kernelbake.remote import ImageFacts, ImageLayoutError, read_cache_manifest, read_image
from kernelbake.signing import intoto
from kernelbake.signing.discover import Artifact, Kind, find_artifacts
from kernelbake.signing.errors import (
    CacheManifestMismatch,
    ImageNotFound,
    InvalidImageReference,
    InvalidSignature,
    LabelMismatch,
    MalformedSignature,
    MissingAttestation,
    NotKernelbakeImage,
    RegistryAccessDenied,
    RegistryMisbehaved,
    RegistryServerFailure,
    RegistryTimeout,
    SubjectMismatch,
    TagMoved,
    Unsigned,
    UntrustedSigner,
    VerificationFailed,
)
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.predicate import BASE_NAME_LABEL, PREDICATE_TYPE, BadPredicate, KernelCachePredicate
from kernelbake.signing.trust import (
    Verified,
    verify_bundle,
    verify_legacy_attestation,
    verify_legacy_signature,
)

__all__ = ["VerificationFailed", "VerifiedImage", "verify_image"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedImage:
    reference: str  # as given
    repository: str  # host/repo
    digest: str  # the verified manifest (or index) digest
    key: CacheKey
    manifest_digest: str  # sha256 of /opt/kernelbake/cache/manifest.json, as attested
    signer: str  # identity (issuer) or key fingerprint of the image signature
    attestation: Mapping[str, Any]  # the decoded kernelbake predicate ({} without one)

    def pinned(self) -> str:
        return f"{self.repository}@{self.digest}"


@contextlib.contextmanager
def _registry_errors(where: str, *, missing_is_image: bool) -> Iterator[None]:
    try:
        yield
    except RegistryNotFound as exc:
        if missing_is_image:
            raise ImageNotFound(f"{where}: image not found ({exc})") from None
        raise RegistryMisbehaved(f"{where}: registry lists content it does not serve ({exc})") from None
    except RegistryUnreachable as exc:
        raise RegistryTimeout(f"{where}: registry unavailable: {exc}") from None
    except RegistryServerError as exc:
        raise RegistryServerFailure(f"{where}: registry unavailable: {exc}") from None
    except RegistryDenied as exc:
        raise RegistryAccessDenied(f"{where}: registry unavailable: {exc}") from None
    except RegistryProtocolError as exc:
        raise RegistryMisbehaved(f"{where}: {exc}") from None


@dataclasses.dataclass(frozen=True)
class _Outcome:
    artifact: Artifact
    verified: Verified | None = None
    failure: VerificationFailed | None = None


# Most telling reason first when no artifact verifies.
_FAILURE_ORDER: tuple[type[VerificationFailed], ...] = (InvalidSignature, UntrustedSigner, MalformedSignature)


def _check(artifact: Artifact, policy: VerifyPolicy) -> _Outcome:
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
    except (InvalidSignature, UntrustedSigner, MalformedSignature) as exc:
        return _Outcome(artifact, failure=exc)
    return _Outcome(artifact, verified=verified)


def _nothing_verified(where: str, outcomes: list[_Outcome], what: str) -> VerificationFailed:
    for cls in _FAILURE_ORDER:
        for o in outcomes:
            if isinstance(o.failure, cls):
                others = sum(1 for x in outcomes if x.failure is not None) - 1
                more = f" (and {others} other unverified artifact{'s' * (others != 1)})" if others > 0 else ""
                return cls(f"{where}: no trusted {what}: {o.failure}{more}")
    return Unsigned(f"{where}: no {what} found")


@dataclasses.dataclass(frozen=True)
class _Claim:
    """What one verified artifact says: a signature or a kernelbake attestation, for digests."""

    kind: str  # "signature" | "attestation" | "other"
    digests: tuple[str, ...]
    verified: Verified
    origin: str
    predicate: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def _claim(outcome: _Outcome) -> _Claim:
    v, origin = outcome.verified, outcome.artifact.origin
    assert v is not None
    if outcome.artifact.kind is Kind.LEGACY_SIGNATURE:
        return _Claim("signature", (intoto.parse_simple_signing(v.payload, source=origin),), v, origin)
    if v.payload_type != intoto.PAYLOAD_TYPE:
        raise MalformedSignature(f"{origin}: signed payloadType {v.payload_type!r} is not in-toto")
    statement = intoto.parse_statement(v.payload, source=origin)
    digests = tuple(statement.digests())
    if statement.predicate_type == intoto.COSIGN_SIGN_PREDICATE:
        return _Claim("signature", digests, v, origin)
    if statement.predicate_type == PREDICATE_TYPE:
        return _Claim("attestation", digests, v, origin, statement.predicate)
    return _Claim("other", digests, v, origin)


def _pick(
    where: str, digest: str, claims: list[_Claim], kind: str, what: str, outcomes: list[_Outcome]
) -> _Claim:
    """The trusted claim of ``kind`` for ``digest``; otherwise the most telling reason why not."""
    mine = [c for c in claims if c.kind == kind and digest in c.digests]
    if mine:
        return mine[0]
    foreign = [c for c in claims if c.kind == kind]
    if foreign:
        c = foreign[0]
        raise SubjectMismatch(
            f"{where}: the trusted {what} at {c.origin} was made for {', '.join(c.digests) or 'no digest'}, "
            f"not {digest}"
        )
    failed = [o for o in outcomes if o.failure is not None]
    if kind == "signature" and failed:
        raise _nothing_verified(where, failed, what)
    tampered = [o for o in failed if isinstance(o.failure, InvalidSignature | MalformedSignature)]
    if tampered:
        raise _nothing_verified(where, tampered, what)
    raise (MissingAttestation if kind == "attestation" else Unsigned)(
        f"{where}: no trusted {what} for {digest}"
    )


def _labels_key(where: str, labels: Mapping[str, str]) -> CacheKey:
    if LABEL_KEY not in labels:
        raise NotKernelbakeImage(f"{where}: no {LABEL_KEY} label; not a kernelbake image")
    try:
        return key_from_labels(labels)
    except InvalidKey as exc:
        raise LabelMismatch(f"{where}: labels are inconsistent: {exc}") from None


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
    return predicate


def _cache_manifest(
    where: str, client: RegistryClient, facts: ImageFacts, key: CacheKey
) -> tuple[str, bytes]:
    """(last layer digest, cache manifest bytes), after checking it was built for ``key``."""
    with _registry_errors(where, missing_is_image=False):
        try:
            layer, data = read_cache_manifest(client, facts)
        except ImageLayoutError as exc:
            raise CacheManifestMismatch(str(exc)) from None
    source = f"{where}: /{CACHE_MANIFEST_PATH}"
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


def _resolve(client: RegistryClient, ref: Reference) -> tuple[Reference, ImageFacts]:
    where = str(ref)
    with _registry_errors(where, missing_is_image=True):
        if ref.tag and ref.digest:
            moved_to = client.resolve(Reference(ref.registry, ref.repository, tag=ref.tag))
            if moved_to != ref.digest:
                raise TagMoved(f"{where}: tag {ref.tag!r} now points to {moved_to}, not the pinned digest")
        top = client.get_manifest(ref)
        pinned = ref.with_digest(top.digest) if not ref.digest else ref
        try:
            facts = read_image(client, pinned, top)
        except ImageLayoutError as exc:
            raise NotKernelbakeImage(str(exc)) from None
    return pinned, facts


def verify_image(
    reference: str, policy: VerifyPolicy, *, client: RegistryClient | None = None
) -> VerifiedImage:
    """Verify ``reference`` (``host/repo:tag``, ``host/repo@sha256:…`` or both) against ``policy``.

    Raises a ``VerificationFailed`` subclass for every failure, a malformed reference included
    (``InvalidImageReference``, also a ``BadInput``); returns only when every check passed.
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
    pinned, facts = _resolve(client, ref)
    digest = facts.top.digest
    where = f"{pinned.name}@{digest}"

    with _registry_errors(where, missing_is_image=False):
        artifacts = find_artifacts(client, pinned)
    if not artifacts:
        raise Unsigned(f"{where}: no signature found (no bundle referrers, no .sig tag)")
    outcomes = [_check(a, policy) for a in artifacts]
    verified = [o for o in outcomes if o.verified is not None]
    if not verified:
        raise _nothing_verified(where, outcomes, "signature")
    claims = [_claim(o) for o in verified]
    signature = _pick(where, digest, claims, "signature", "signature", outcomes)

    key = _labels_key(where, facts.labels)
    attested: dict[str, Any] = {}
    if not policy.require_attestation and not any(c.kind == "attestation" for c in claims):
        _, data = _cache_manifest(where, client, facts, key)
        manifest_digest = sha256_digest(data)
    else:
        attestation = _pick(where, digest, claims, "attestation", "kernelbake attestation", outcomes)
        predicate = _check_predicate(where, facts, key, attestation)
        layer_digest, data = _cache_manifest(where, client, facts, key)
        manifest_digest = _check_cache_manifest(where, predicate, layer_digest, data)
        attested = dict(attestation.predicate)
    return VerifiedImage(
        reference=reference,
        repository=pinned.name,
        digest=digest,
        key=key,
        manifest_digest=manifest_digest,
        signer=signature.verified.signer,
        attestation=attested,
    )
