"""``sign_image``: sign an image's digest (never a tag) and attach a kernelbake attestation,
stored where cosign and admission controllers look for them."""

from __future__ import annotations

import dataclasses

from kernelbake.errors import BadInput
from kernelbake.oci import Descriptor, Manifest, Reference, RegistryClient, RegistryNotFound, parse_reference
from kernelbake.oci import types as mt
from kernelbake.oci.types import sha256_digest
from kernelbake.remote import read_cache_manifest, read_image, top_manifest
from kernelbake.signing import formats, intoto
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.predicate import PREDICATE_TYPE, KernelCachePredicate, predicate_for
from kernelbake.signing.signer import SignedStatement, Signer
from kernelbake.signing.verify import Existing, existing_signatures


@dataclasses.dataclass(frozen=True, kw_only=True)
class SignResult:
    reference: str  # host/repo@digest that was signed
    digest: str
    signer: str
    referrers: tuple[str, ...]  # digests of the bundle manifests pushed
    legacy_tags: tuple[str, ...]  # .sig/.att tags written
    predicate: KernelCachePredicate | None
    # What was not signed again: the same key had signed it already ("signature",
    # "attestation", and with legacy ".sig", ".att").
    already: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line: what was signed, and what the same key had signed already."""
        legacy = f" (+ {', '.join(self.legacy_tags)})" if self.legacy_tags else ""
        if not self.already:
            what = "signed and attested" if self.predicate else "signed"
            return f"{what} {self.reference} by {self.signer}{legacy}"
        skipped = f"already signed by {self.signer}, skipped ({', '.join(self.already)})"
        if not self.referrers and not self.legacy_tags:
            return f"{self.reference}: {skipped}"
        written = ", ".join([*(["bundle"] * len(self.referrers)), *self.legacy_tags])
        return f"signed {self.reference} by {self.signer} ({written}); {skipped}"


def _vouch(signer: Signer, subject: Descriptor, bundle: bytes) -> dict[str, str]:
    """The vouch annotations of a bundle (``formats.ANN_VOUCH_*``): a verifier that trusts the
    signer finds it from the referrers listing alone, among any number of look-alikes."""
    layer = sha256_digest(bundle)
    return {
        formats.ANN_VOUCH_LAYER: layer,
        **signer.vouch(formats.vouch_payload(subject.digest, layer), bundle),
    }


def push_bundle(
    client: RegistryClient,
    ref: Reference,
    subject: Descriptor,
    bundle: bytes,
    predicate_type: str,
    signer: Signer,
) -> str:
    manifest, blob = formats.bundle_referrer(
        subject, bundle, predicate_type, created=formats.now_rfc3339(), vouch=_vouch(signer, subject, bundle)
    )
    client.put_blob(ref, mt.EMPTY_JSON)
    client.put_blob(ref, blob)
    return client.push_referrer(ref, manifest, mt.OCI_MANIFEST)


def _append_legacy(client: RegistryClient, ref: Reference, tag: str, layer: Descriptor, data: bytes) -> None:
    """Add ``layer`` to the ``.sig``/``.att`` image at ``tag`` (created if absent), as cosign does."""
    tag_ref = ref.with_tag(tag)
    try:
        current = client.get_manifest(tag_ref, accept=mt.IMAGE_MANIFESTS)
        # Same payload signed by another key is another layer; only an identical one is replaced.
        layers = [d for d in current.layers if (d.digest, d.annotations) != (layer.digest, layer.annotations)]
    except RegistryNotFound:
        layers = []
    layers.append(layer)
    manifest, config = formats.legacy_manifest(layers)
    client.put_blob(ref, data)
    client.put_blob(ref, config)
    client.put_manifest(tag_ref, manifest, mt.OCI_MANIFEST)


def _existing(client: RegistryClient, pinned: Reference, signer: Signer) -> Existing:
    """What ``signer``'s key already attached to the digest (nothing for keyless signers, which
    always sign): each ``make image`` signs what it pushed, and an unchanged digest would
    otherwise collect one more signature and attestation per run."""
    key = signer.public_key
    if key is None:
        return Existing()
    policy = VerifyPolicy(keys=(key,), require_attestation=False, source=f"key {key.fingerprint}")
    return existing_signatures(client, pinned, policy)


def sign_image(
    reference: str,
    signer: Signer,
    *,
    client: RegistryClient | None = None,
    attest: bool = True,
    legacy: bool = False,
    top: Manifest | None = None,
) -> SignResult:
    """Sign the digest ``reference`` resolves to (once); attest what the image holds.

    ``legacy`` also writes cosign 2's ``.sig``/``.att`` tags for verifiers that read only those.
    A reference with both a tag and a digest is refused if the tag has moved. ``top``: the
    manifest ``reference`` names, when the caller has read it already (``fleet.read_top``).
    """
    ref = parse_reference(reference)
    client = client or RegistryClient()
    top = top_manifest(client, ref, top)
    _refuse_moved_tag(client, ref, reference)
    at = _Subject(
        client, Reference(ref.registry, ref.repository, digest=top.digest), top.descriptor(), signer
    )
    predicate = _predicate(client, at.pinned, top) if attest else None
    existing = _existing(client, at.pinned, signer)
    already: list[str] = []
    referrers: list[str] = []
    if existing.signature:
        already.append("signature")
    else:
        referrers.append(_sign(at))
    # An attestation is made once, for whichever of its two places (bundle, .att) lacks it.
    wanted = predicate.to_json() if predicate is not None else None
    need_bundle = wanted is not None and wanted not in existing.attestations
    need_legacy = legacy and wanted is not None and wanted not in existing.legacy_attestations
    attestation = None
    if wanted is not None and (need_bundle or need_legacy):
        attestation = signer.sign_statement(
            intoto.make_statement(at.pinned.name, at.digest, PREDICATE_TYPE, wanted)
        )
    if need_bundle and attestation is not None:
        referrers.append(
            push_bundle(client, at.pinned, at.subject, attestation.bundle, PREDICATE_TYPE, signer)
        )
    elif predicate is not None:
        already.append("attestation")
    tags: list[str] = []
    if legacy:
        tags, skipped = _legacy(
            at, existing, attestation if need_legacy else None, attested=predicate is not None
        )
        already += skipped
    return SignResult(
        reference=at.pinned.pinned(),
        digest=at.digest,
        signer=signer.identity,
        referrers=tuple(referrers),
        legacy_tags=tuple(tags),
        predicate=predicate,
        already=tuple(already),
    )


@dataclasses.dataclass(frozen=True)
class _Subject:
    """The image being signed: its digest in its repository, and who signs it."""

    client: RegistryClient
    pinned: Reference
    subject: Descriptor
    signer: Signer

    @property
    def digest(self) -> str:
        return self.subject.digest


def _refuse_moved_tag(client: RegistryClient, ref: Reference, reference: str) -> None:
    """A reference with a tag and a digest is signed only while the tag still names the digest."""
    if ref.tag and ref.digest:
        now = client.resolve(Reference(ref.registry, ref.repository, tag=ref.tag))
        if now != ref.digest:
            raise BadInput(f"{reference}: tag {ref.tag!r} now points to {now}; refusing to sign")


def _predicate(client: RegistryClient, pinned: Reference, top: Manifest) -> KernelCachePredicate:
    """What the image holds, read from the registry: the attestation's predicate."""
    facts = read_image(client, pinned, top)
    layer, cache_manifest = read_cache_manifest(client, facts)
    return predicate_for(facts, layer.digest, cache_manifest)


def _sign(at: _Subject) -> str:
    """Sign the digest; the digest of the bundle manifest pushed as its referrer."""
    signature = at.signer.sign_statement(
        intoto.make_statement(at.pinned.name, at.digest, intoto.COSIGN_SIGN_PREDICATE, {})
    )
    return push_bundle(
        at.client, at.pinned, at.subject, signature.bundle, intoto.COSIGN_SIGN_PREDICATE, at.signer
    )


def _legacy(
    at: _Subject, existing: Existing, attestation: SignedStatement | None, *, attested: bool
) -> tuple[list[str], list[str]]:
    """cosign 2's ``.sig`` and (``attestation`` given) ``.att`` tags: the tags written, and the
    suffixes the same key had written already."""
    tags: list[str] = []
    already: list[str] = []
    if existing.legacy_signature:
        already.append(formats.SIG_SUFFIX)
    else:
        tags.append(_legacy_signature(at))
    if attestation is not None:
        tags.append(_legacy_attestation(at, attestation))
    elif attested:
        already.append(formats.ATT_SUFFIX)
    return tags, already


def _legacy_signature(at: _Subject) -> str:
    tag = formats.legacy_tag(at.digest, formats.SIG_SUFFIX)
    payload = intoto.simple_signing_payload(at.pinned.name, at.digest)
    sig = at.signer.sign_payload(payload)
    layer = formats.legacy_layer(
        payload, formats.SIMPLE_SIGNING, {formats.ANN_SIGNATURE: sig.signature, **sig.annotations}
    )
    _append_legacy(at.client, at.pinned, tag, layer, payload)
    return tag


def _legacy_attestation(at: _Subject, attestation: SignedStatement) -> str:
    tag = formats.legacy_tag(at.digest, formats.ATT_SUFFIX)
    layer = formats.legacy_layer(
        attestation.envelope,
        formats.DSSE_ENVELOPE,
        {
            formats.ANN_SIGNATURE: "",
            formats.ANN_PREDICATE_TYPE: PREDICATE_TYPE,
            **attestation.legacy_annotations,
        },
    )
    _append_legacy(at.client, at.pinned, tag, layer, attestation.envelope)
    return tag
