"""Statements signed and attached beside kernelbake's own: the tests' way to put another
attestation (a wrong predicate, a smuggled one) on an image, as an attacker or another tool
would. The product never attaches anything but its own predicate (``sign_image``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernelbake.oci import Reference, RegistryClient, parse_reference
from kernelbake.signing import intoto
from kernelbake.signing.sign import push_bundle
from kernelbake.signing.signer import Signer


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
    return push_bundle(client, pinned, top.descriptor(), signed.bundle, predicate_type, signer)
