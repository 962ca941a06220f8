"""Admission verifies through ``kernelbake.signing``: junk attached next to a valid signature does
not get a correctly signed image denied, and junk alone does not get an image admitted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernelbake.oci import RegistryClient
from kernelbake.oci.types import sha256_digest
from kernelbake.settings import Settings
from kernelbake.signing import formats, intoto
from tests.admission import documents, live
from tests.signing.images import PushedImage
from tests.signing.tamper import delete_blob, list_around, list_referrers, push_lookalikes, push_referrer
from tests.support.memregistry import memory_registry

pytestmark = pytest.mark.registry

SBOM = "application/vnd.example.sbom.v1+json"


def _add_junk(client: RegistryClient, image: PushedImage) -> None:
    gone = json.dumps({"mediaType": formats.BUNDLE_V03, "junk": image.digest}).encode()
    entries = [push_referrer(client, image, gone)]
    delete_blob(image, sha256_digest(gone))
    entries.append(push_referrer(client, image, b"{" + b" " * (5 << 20) + b"}"))
    entries += [
        push_referrer(client, image, b'{"sbom": %d}' % i, artifact_type=SBOM, layer_type=SBOM)
        for i in range(64)
    ]
    list_referrers(client, image, entries)


def _review(policy: Path, tmp_path: Path, doc: dict[str, Any]) -> tuple[int, dict[str, Any], str]:
    request = tmp_path / "request.json"
    request.write_text(json.dumps(doc))
    done = live.kernelbake("admission", "review", "--policy", str(policy), str(request), check=False)
    response: dict[str, Any] = json.loads(done.stdout)["response"]
    return done.returncode, response, done.stderr


def test_a_signed_image_with_junk_referrers_is_admitted_and_junk_alone_is_not(
    registry: str, tmp_path: Path
) -> None:
    key, pub = live.generate_key(tmp_path / "keys", "trusted")
    signed = live.push_target(registry, "kernelbake/junked", "h100", "h100", tmp_path / "signed")
    live.sign(signed, key)
    junk_only = live.push_target(registry, "kernelbake/junked", "junk", "h100", tmp_path / "junk")
    client = RegistryClient(Settings(docker_config=tmp_path / "docker-config"), timeout=30)
    _add_junk(client, signed)
    _add_junk(client, junk_only)
    policy = live.write_policy(tmp_path / "policy.yaml", [f"{registry}/kernelbake/**"], pub)

    doc = documents.load("pod-create", signed.tagged)
    rc, response, err = _review(policy, tmp_path, doc)
    assert rc == 0 and response["allowed"] is True, err
    assert documents.apply_patch(doc, response)["spec"]["containers"][0]["image"] == signed.pinned

    rc, response, err = _review(policy, tmp_path, documents.load("pod-create", junk_only.tagged))
    assert rc == 1 and response["allowed"] is False
    message = json.dumps(response["status"])
    assert "no usable signature found; skipped 66 attached artifacts" in message, message


def test_lookalikes_appended_after_signing_do_not_get_a_signed_image_denied(
    registry: str, tmp_path: Path
) -> None:
    # The report: 32 bundle referrers with cosign's predicate annotation, appended after a valid
    # signing, pushed the real signature out of the 32 examined and the pod was denied. Here 200
    # before and 200 after, half copying every annotation of the real referrers (the vouch too).
    key, pub = live.generate_key(tmp_path / "keys", "trusted")
    signed = live.push_target(registry, "kernelbake/lookalikes", "h100", "h100", tmp_path / "signed")
    live.sign(signed, key)
    client = RegistryClient(Settings(docker_config=tmp_path / "docker-config"), timeout=30)
    real = [dict(d.annotations) for d in client.referrers(signed.ref.with_digest(signed.digest))]
    predicate_only = {formats.ANN_BUNDLE_PREDICATE: intoto.COSIGN_SIGN_PREDICATE}

    def annotate(i: int) -> dict[str, str]:
        return {**(real[i % len(real)] if i % 2 else predicate_only), "junk": str(i)}

    before = push_lookalikes(client, signed, 200, annotate)
    after = push_lookalikes(client, signed, 200, lambda i: annotate(200 + i))
    list_around(client, signed, before, after)
    policy = live.write_policy(tmp_path / "policy.yaml", [f"{registry}/kernelbake/**"], pub)
    rc, response, err = _review(policy, tmp_path, documents.load("pod-create", signed.tagged))
    assert rc == 0 and response["allowed"] is True, err


def test_junk_pushed_before_signing_on_a_paged_referrers_api_does_not_deny(tmp_path: Path) -> None:
    # The report: 150 junk referrers pushed for a digest before it was signed, on a registry
    # with the referrers API, denied the signed pod (403): the signature was past page one.
    # The in-memory registry pages its API as the distribution spec says (Link rel="next").
    key, pub = live.generate_key(tmp_path / "keys", "trusted")
    with memory_registry(referrers_api=True, page_size=20) as (registry, store):
        signed = live.push_target(registry, "kernelbake/paged", "h100", "h100", tmp_path / "signed")
        client = RegistryClient(Settings(docker_config=tmp_path / "docker-config"), timeout=30)
        for i in range(150):
            push_referrer(client, signed, b'{"sbom": %d}' % i, artifact_type=SBOM, layer_type=SBOM)
        live.sign(signed, key)
        policy = live.write_policy(tmp_path / "policy.yaml", [f"{registry}/kernelbake/**"], pub)
        store.pages_served = 0
        rc, response, err = _review(policy, tmp_path, documents.load("pod-create", signed.tagged))
        assert rc == 0 and response["allowed"] is True, err
        assert store.pages_served == 8
