"""The model's variant index: every pushed variant (an image or a cache artifact per GPU) read
back from the registry (its labels rebuild its key, its config names its platform) and listed in
one OCI index, pushed under the tag that digests their keys. ``kernelbake.fleet`` reads it and
resolves a GPU's variant."""

from __future__ import annotations

from collections.abc import Sequence

from kernelbake.contract import jsondoc
from kernelbake.contract.artifact import kind_of
from kernelbake.contract.key import key_from_labels
from kernelbake.contract.variants import OCI_INDEX, Variant, encode, index_document, index_tag
from kernelbake.errors import BadInput
from kernelbake.oci import Reference, RegistryClient, parse_reference
from kernelbake.remote import MAX_CONFIG_BYTES, ImageLayoutError, read_image, registry_reachable

# Docker's and OCI's names for the machine architecture differ from uname's.
_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}


def variant_of(client: RegistryClient, pushed: str) -> Variant:
    """The index entry for ``pushed`` (``repo@sha256:…``), from what the registry holds."""
    ref = parse_reference(pushed)
    top = client.get_manifest(ref)
    facts = read_image(client, ref.with_digest(top.digest), top)
    try:
        config = jsondoc.loads(client.get_blob(ref, facts.manifest.config.digest, max_bytes=MAX_CONFIG_BYTES))
    except ValueError:
        raise ImageLayoutError(f"{pushed}: image config is not JSON") from None
    arch = str(config.get("architecture") or "amd64")
    return Variant(
        key=key_from_labels(facts.labels),
        digest=top.digest,
        size=len(top.data),
        media_type=top.media_type,
        os=str(config.get("os") or "linux"),
        architecture=_ARCHITECTURES.get(arch, arch),
        kind=kind_of(facts.labels),
    )


def publish_index(pushed: Sequence[str], *, client: RegistryClient | None = None) -> str:
    """Push the index of ``pushed`` (variants of one repository, ``repo@sha256:…``) under the tag
    that digests their keys; returns ``repo:tag@sha256:…`` of the index."""
    refs = [parse_reference(p) for p in pushed]
    names = {r.name for r in refs}
    if len(names) != 1:
        raise BadInput(f"an index lists variants of one repository, got {', '.join(sorted(names))}")
    client = client or RegistryClient()
    repo = refs[0]
    with registry_reachable(repo.registry):
        variants = [variant_of(client, p) for p in pushed]
        tag = index_tag([v.key for v in variants])
        data = encode(index_document(variants))
        result = client.put_manifest(Reference(repo.registry, repo.repository, tag=tag), data, OCI_INDEX)
    return f"{repo.name}:{tag}@{result.digest}"
