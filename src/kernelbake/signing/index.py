"""``verify_index``: a model's GPU-variant index and every variant it lists.

The index is signed like an image (its signed bytes are the list and each variant's key
annotations), each variant is verified like any image, and what a variant verified as (its
labels, its attestation) must be the key the index's annotation claims for it: an index that
sends an H200 node to the H100 image under the H200 key fails closed, naming the variant.
Every part is checked, so the report says all that is wrong; the first failure decides.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kernelbake.contract.variants import InvalidIndex, Variant
from kernelbake.fleet import FleetIndex, read_top
from kernelbake.oci import InvalidReference, Manifest, Reference, RegistryClient
from kernelbake.signing.errors import (
    InvalidImageReference,
    LabelMismatch,
    TagMoved,
    VerificationFailed,
    registry_errors,
)
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.verify import (
    VerifiedImage,
    VerifiedSignature,
    skipped_json,
    verify_image,
    verify_signature,
)


@dataclasses.dataclass(frozen=True)
class VariantResult:
    variant: Variant
    pinned: str  # repo@digest
    verified: VerifiedImage | None = None
    failure: VerificationFailed | None = None


@dataclasses.dataclass(frozen=True)
class IndexVerification:
    index: FleetIndex
    signature: VerifiedSignature | None
    signature_failure: VerificationFailed | None
    variants: tuple[VariantResult, ...]

    @property
    def failures(self) -> tuple[VerificationFailed, ...]:
        """Every failure, the index's own first."""
        first = (self.signature_failure,) if self.signature_failure is not None else ()
        return first + tuple(v.failure for v in self.variants if v.failure is not None)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self, reference: str) -> dict[str, Any]:
        """``kernelbake verify --json`` of an index named ``reference``: every part, failed or not."""
        sig = self.signature
        return {
            "verified": self.ok,
            "reference": reference,
            "index": {
                "digest": self.index.ref.digest,
                "verified": sig is not None,
                "signer": sig.signer if sig else None,
                "error": str(self.signature_failure) if self.signature_failure else None,
                "skipped": skipped_json(sig.skipped) if sig else [],
            },
            "variants": [
                {
                    "device": r.variant.key.device,
                    "arch": r.variant.key.arch,
                    "digest": r.variant.digest,
                    "key_digest": r.variant.key.digest,
                    "verified": r.failure is None,
                    "signer": r.verified.signer if r.verified else None,
                    "cache_manifest_digest": r.verified.manifest_digest if r.verified else None,
                    "error": str(r.failure) if r.failure else None,
                }
                for r in self.variants
            ],
        }


def read_subject(reference: str, client: RegistryClient) -> tuple[Manifest, FleetIndex | None]:
    """What ``reference`` names (one read) and the GPU-variant index that is, or None for
    anything else (``verify_image`` then says what is wrong with it); the registry's trouble
    and a bad reference or index as the verification failures they are."""
    try:
        with registry_errors(reference, missing_is_image=True):
            return read_top(reference, client=client)
    except InvalidReference as exc:
        raise InvalidImageReference(str(exc)) from None
    except InvalidIndex as exc:
        # Annotations that disagree with the key they carry: edited after publishing.
        raise LabelMismatch(str(exc)) from None


def verify_index(
    index: FleetIndex, policy: VerifyPolicy, client: RegistryClient, *, tag: str | None = None
) -> IndexVerification:
    """Verify the index's signature and every variant. ``tag``: the tag the index was named by
    together with its digest (``repo:tag@digest``), which must still point there."""
    where = index.ref.pinned()
    signature: VerifiedSignature | None = None
    signature_failure: VerificationFailed | None = None
    try:
        if tag is not None:
            with registry_errors(where, missing_is_image=True):
                moved_to = client.resolve(Reference(index.ref.registry, index.ref.repository, tag=tag))
            if moved_to != index.ref.digest:
                raise TagMoved(f"{where}: tag {tag!r} now points to {moved_to}, not the pinned digest")
        signature = verify_signature(client, index.ref, policy)
    except VerificationFailed as exc:
        signature_failure = exc
    return IndexVerification(
        index, signature, signature_failure, tuple(_variant(index, v, policy, client) for v in index.variants)
    )


def _variant(
    index: FleetIndex, variant: Variant, policy: VerifyPolicy, client: RegistryClient
) -> VariantResult:
    pinned = index.pinned(variant)
    try:
        verified = verify_image(pinned, policy, client=client)
    except VerificationFailed as exc:
        return VariantResult(variant, pinned, failure=exc)
    if verified.key != variant.key:
        differ = [n for n, v in variant.key.as_dict().items() if verified.key.as_dict()[n] != v]
        return VariantResult(
            variant,
            pinned,
            verified,
            LabelMismatch(
                f"{pinned}: the index {index.ref.pinned()} claims key {variant.key.digest} "
                f"({variant.key.device}) for this variant, but it verifies as {verified.key.digest} "
                f"({verified.key.device}; fields differ: {', '.join(differ)}); re-publish and re-sign the index"
            ),
        )
    return VariantResult(variant, pinned, verified)
