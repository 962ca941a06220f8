"""Edit what is in the registry the way an attacker (or a broken mirror) would."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from kernelbake.oci import Descriptor, Reference, RegistryClient, RegistryNotFound, fallback_tag
from kernelbake.oci import types as mt
from kernelbake.signing import formats
from tests.signing.images import PushedImage


def _rewrite_referrers(
    client: RegistryClient, image: PushedImage, edit_blob: Callable[[bytes], bytes]
) -> list[str]:
    """Replace every bundle referrer of ``image`` by one whose bundle blob is ``edit_blob(old)``,
    and point the fallback index at the replacements. Returns the new manifest digests.

    The key's vouch goes (an editor without the key cannot vouch for the new blob; one it kept
    would still name the genuine bundle, which verification would then read and accept)."""
    ref = image.ref.with_digest(image.digest)
    new_entries = []
    for desc in client.referrers(ref):
        manifest = client.get_manifest(ref.with_digest(desc.digest))
        layer = manifest.layers[0]
        blob = edit_blob(client.get_blob(ref, layer.digest))
        client.put_blob(ref, blob)
        doc = dict(manifest.doc)
        doc["layers"] = [{**layer.to_json(), "digest": mt.sha256_digest(blob), "size": len(blob)}]
        annotations = _without_vouch(manifest.annotations)
        doc["annotations"] = annotations
        data = mt.encode_json(doc)
        pushed = client.put_manifest(Reference(ref.registry, ref.repository), data, mt.OCI_MANIFEST)
        entry = {**desc.to_json(), "digest": pushed.digest, "size": len(data), "annotations": annotations}
        new_entries.append(entry)
    index = mt.encode_json({"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": new_entries})
    client.put_manifest(ref.with_tag(fallback_tag(image.digest)), index, mt.OCI_INDEX)
    return [e["digest"] for e in new_entries]


VOUCH = (
    formats.ANN_VOUCH_LAYER,
    formats.ANN_VOUCH_KEY,
    formats.ANN_VOUCH_CERTIFICATE,
    formats.ANN_VOUCH_SIGNATURE,
)


def _without_vouch(annotations: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in annotations.items() if k not in VOUCH}


def rewrite_bundles(
    client: RegistryClient, image: PushedImage, edit: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    _rewrite_referrers(client, image, lambda b: json.dumps(edit(json.loads(b))).encode())


def replace_bundles(client: RegistryClient, image: PushedImage, data: bytes) -> None:
    _rewrite_referrers(client, image, lambda _b: data)


def copy_signatures(client: RegistryClient, source: PushedImage, target: PushedImage) -> None:
    """List ``source``'s referrers (and legacy tags) as if they were ``target``'s."""
    src = source.ref.with_digest(source.digest)
    dst = target.ref.with_digest(target.digest)
    assert src.name == dst.name, "copy within one repository (blobs are per repository)"
    entries = [d.to_json() for d in client.referrers(src)]
    index = mt.encode_json({"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": entries})
    client.put_manifest(dst.with_tag(fallback_tag(target.digest)), index, mt.OCI_INDEX)
    for suffix in (formats.SIG_SUFFIX, formats.ATT_SUFFIX):
        try:
            m = client.get_manifest(src.with_tag(formats.legacy_tag(source.digest, suffix)))
        except RegistryNotFound:
            continue
        client.put_manifest(dst.with_tag(formats.legacy_tag(target.digest, suffix)), m.data, m.media_type)


def drop_bundles(client: RegistryClient, image: PushedImage) -> None:
    """Empty the fallback index: only the legacy .sig/.att tags remain."""
    ref = image.ref.with_digest(image.digest)
    index = mt.encode_json({"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": []})
    client.put_manifest(ref.with_tag(fallback_tag(image.digest)), index, mt.OCI_INDEX)


def rewrite_legacy_annotations(
    client: RegistryClient, image: PushedImage, suffix: str, edit: Callable[[dict[str, str]], dict[str, str]]
) -> None:
    """Rewrite the annotations of every layer of the ``.sig``/``.att`` image."""
    ref = image.ref.with_digest(image.digest)
    tag_ref = ref.with_tag(formats.legacy_tag(image.digest, suffix))
    manifest = client.get_manifest(tag_ref)
    doc = dict(manifest.doc)
    doc["layers"] = [{**d.to_json(), "annotations": edit(dict(d.annotations))} for d in manifest.layers]
    client.put_manifest(tag_ref, mt.encode_json(doc), manifest.media_type)


# -- junk next to a valid signature ----------------------------------------------------------


def list_referrers(
    client: RegistryClient, image: PushedImage, entries: list[dict[str, Any]], *, first: bool = True
) -> None:
    """List ``entries`` (descriptor JSON) in ``image``'s fallback referrers index, before what is
    there (``first``) or after it, as the newest."""
    ref = image.ref.with_digest(image.digest)
    current = [d.to_json() for d in client.referrers(ref)]
    listed = entries + current if first else current + entries
    index = mt.encode_json({"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": listed})
    client.put_manifest(ref.with_tag(fallback_tag(image.digest)), index, mt.OCI_INDEX)


def push_referrer(
    client: RegistryClient,
    image: PushedImage,
    blob: bytes,
    *,
    artifact_type: str = formats.BUNDLE_V03,
    layer_type: str = formats.BUNDLE_V03,
    declared_size: int | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Push a referrer manifest of ``image`` with ``blob`` as its one layer (declared as
    ``declared_size`` bytes if given); returns its descriptor JSON, not yet listed anywhere."""
    ref = image.ref.with_digest(image.digest)
    client.put_blob(ref, mt.EMPTY_JSON)
    client.put_blob(ref, blob)
    layer = {"mediaType": layer_type, "digest": mt.sha256_digest(blob), "size": declared_size or len(blob)}
    doc = {
        "schemaVersion": 2,
        "mediaType": mt.OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": {"mediaType": mt.OCI_EMPTY, "digest": mt.sha256_digest(mt.EMPTY_JSON), "size": 2},
        "layers": [layer],
        "subject": client.get_manifest(ref).descriptor().to_json(),
        **({"annotations": annotations} if annotations else {}),
    }
    data = mt.encode_json(doc)
    pushed = client.put_manifest(Reference(ref.registry, ref.repository), data, mt.OCI_MANIFEST)
    entry: dict[str, Any] = {
        "mediaType": mt.OCI_MANIFEST,
        "digest": pushed.digest,
        "size": len(data),
        "artifactType": artifact_type,
    }
    if annotations:
        entry["annotations"] = annotations
    return entry


def delete_blob(image: PushedImage, digest: str) -> None:
    """What a registry's garbage collection or an operator does: the blob is gone (404)."""
    url = f"http://{image.ref.registry}/v2/{image.ref.repository}/blobs/{digest}"
    with urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10) as resp:
        assert resp.status == 202, resp.status


def prepend_legacy_layers(client: RegistryClient, image: PushedImage, count: int) -> None:
    """Put ``count`` simple-signing layers whose signatures verify under no key before the layers
    of ``image``'s ``.sig`` tag (older, as cosign appends)."""
    ref = image.ref.with_digest(image.digest)
    tag_ref = ref.with_tag(formats.legacy_tag(image.digest, formats.SIG_SUFFIX))
    manifest = client.get_manifest(tag_ref)
    junk = []
    for i in range(count):
        payload = json.dumps({"junk": i}).encode()
        client.put_blob(ref, payload)
        layer = Descriptor.of(payload, formats.SIMPLE_SIGNING, annotations={formats.ANN_SIGNATURE: "AAAA"})
        junk.append(layer.to_json())
    doc = dict(manifest.doc)
    doc["layers"] = junk + [d.to_json() for d in manifest.layers]
    client.put_manifest(tag_ref, mt.encode_json(doc), manifest.media_type)


def push_lookalikes(
    client: RegistryClient,
    image: PushedImage,
    count: int,
    annotations: Callable[[int], dict[str, str]],
    blob: bytes = b'{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}',
) -> list[dict[str, Any]]:
    """``count`` bundle-typed referrer manifests of ``image`` sharing one junk ``blob``, the
    ``i``-th annotated ``annotations(i)``; their descriptors, not yet listed anywhere."""
    ref = image.ref.with_digest(image.digest)
    client.put_blob(ref, mt.EMPTY_JSON)
    client.put_blob(ref, blob)
    subject = client.get_manifest(ref).descriptor().to_json()
    layer = {"mediaType": formats.BUNDLE_V03, "digest": mt.sha256_digest(blob), "size": len(blob)}
    entries = []
    for i in range(count):
        annotated = annotations(i)  # once: a forger may make a fresh key each time
        doc = {
            "schemaVersion": 2,
            "mediaType": mt.OCI_MANIFEST,
            "artifactType": formats.BUNDLE_V03,
            "config": {"mediaType": mt.OCI_EMPTY, "digest": mt.sha256_digest(mt.EMPTY_JSON), "size": 2},
            "layers": [layer],
            "subject": subject,
            "annotations": annotated,
        }
        data = mt.encode_json(doc)
        pushed = client.put_manifest(Reference(ref.registry, ref.repository), data, mt.OCI_MANIFEST)
        entries.append(
            {
                "mediaType": mt.OCI_MANIFEST,
                "digest": pushed.digest,
                "size": len(data),
                "artifactType": formats.BUNDLE_V03,
                "annotations": annotated,
            }
        )
    return entries


def list_around(
    client: RegistryClient, image: PushedImage, before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> None:
    """List ``image``'s referrers between ``before`` (oldest) and ``after`` (newest)."""
    ref = image.ref.with_digest(image.digest)
    current = [d.to_json() for d in client.referrers(ref)]
    index = mt.encode_json(
        {"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": before + current + after}
    )
    client.put_manifest(ref.with_tag(fallback_tag(image.digest)), index, mt.OCI_INDEX)
