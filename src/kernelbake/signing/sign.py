"""``sign_image``: sign an image's digest (never a tag) and attach a kernelbake attestation,
stored where cosign and admission controllers look for them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kernelbake.errors import BadInput
from kernelbake.oci import Descriptor, Manifest, Reference, RegistryClient, RegistryNotFound, parse_reference
from kernelbake.oci import types as mt
from kernelbake.remote import read_cache_manifest, read_image, top_manifest
from kernelbake.signing import formats, intoto
from kernelbake.signing.predicate import PREDICATE_TYPE, KernelCachePredicate, predicate_for
from kernelbake.signing.signer import Signer


@dataclasses.dataclass(frozen=True, kw_only=True)
class SignResult:
    reference: str  # host/repo@digest that was signed
    digest: str
    signer: str
    referrers: tuple[str, ...]  # digests of the bundle manifests pushed
    legacy_tags: tuple[str, ...]  # .sig/.att tags written
    predicate: KernelCachePredicate | None


def _push_bundle(
    client: RegistryClient, ref: Reference, subject: Descriptor, bundle: bytes, predicate_type: str
) -> str:
    manifest, blob = formats.bundle_referrer(subject, bundle, predicate_type, created=formats.now_rfc3339())
    client.put_blob(ref, mt.EMPTY_JSON)
    client.put_blob(ref, blob)
    return client.push_referrer(ref, manifest, mt.OCI_MANIFEST)


def attach_statement(
    reference: str,
    signer: Signer,
    predicate_type: str,
    predicate: Mapping[str, Any],
    *,
    client: RegistryClient | None = None,
) -> str:
    """Sign an in-toto statement about ``reference``'s digest and attach it as a bundle referrer
    (e.g. another attestation type); returns the referrer manifest's digest."""
    ref = parse_reference(reference)
    client = client or RegistryClient()
    top = client.get_manifest(ref)
    pinned = Reference(ref.registry, ref.repository, digest=top.digest)
    signed = signer.sign_statement(intoto.make_statement(pinned.name, top.digest, predicate_type, predicate))
    return _push_bundle(client, pinned, top.descriptor(), signed.bundle, predicate_type)


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
    if ref.tag and ref.digest:
        now = client.resolve(Reference(ref.registry, ref.repository, tag=ref.tag))
        if now != ref.digest:
            raise BadInput(f"{reference}: tag {ref.tag!r} now points to {now}; refusing to sign")
    pinned = Reference(ref.registry, ref.repository, digest=top.digest)
    subject = top.descriptor()

    predicate: KernelCachePredicate | None = None
    if attest:
        facts = read_image(client, pinned, top)
        layer, cache_manifest = read_cache_manifest(client, facts)
        predicate = predicate_for(facts, layer.digest, cache_manifest)

    signature = signer.sign_statement(
        intoto.make_statement(pinned.name, top.digest, intoto.COSIGN_SIGN_PREDICATE, {})
    )
    referrers = [_push_bundle(client, pinned, subject, signature.bundle, intoto.COSIGN_SIGN_PREDICATE)]
    attestation = None
    if predicate is not None:
        attestation = signer.sign_statement(
            intoto.make_statement(pinned.name, top.digest, PREDICATE_TYPE, predicate.to_json())
        )
        referrers.append(_push_bundle(client, pinned, subject, attestation.bundle, PREDICATE_TYPE))

    tags: list[str] = []
    if legacy:
        payload = intoto.simple_signing_payload(pinned.name, top.digest)
        sig = signer.sign_payload(payload)
        tag = formats.legacy_tag(top.digest, formats.SIG_SUFFIX)
        layer_desc = formats.legacy_layer(
            payload, formats.SIMPLE_SIGNING, {formats.ANN_SIGNATURE: sig.signature, **sig.annotations}
        )
        _append_legacy(client, pinned, tag, layer_desc, payload)
        tags.append(tag)
        if attestation is not None:
            tag = formats.legacy_tag(top.digest, formats.ATT_SUFFIX)
            layer_desc = formats.legacy_layer(
                attestation.envelope,
                formats.DSSE_ENVELOPE,
                {
                    formats.ANN_SIGNATURE: "",
                    formats.ANN_PREDICATE_TYPE: PREDICATE_TYPE,
                    **attestation.legacy_annotations,
                },
            )
            _append_legacy(client, pinned, tag, layer_desc, attestation.envelope)
            tags.append(tag)

    return SignResult(
        reference=pinned.pinned(),
        digest=top.digest,
        signer=signer.identity,
        referrers=tuple(referrers),
        legacy_tags=tuple(tags),
        predicate=predicate,
    )
