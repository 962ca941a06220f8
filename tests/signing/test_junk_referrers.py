"""Junk attached next to a valid signature cannot deny the image, nor make verification slow:
any attached signature that satisfies the policy is enough (as with cosign); the rest are skipped
with a note; reads are bounded in count and size. With nothing valid, verification fails closed
and says why."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from kernelbake.cli import main
from kernelbake.oci import RegistryClient
from kernelbake.oci.types import sha256_digest
from kernelbake.signing import discover, formats, intoto
from kernelbake.signing.errors import MalformedSignature, Unsigned, UntrustedSigner, VerificationFailed
from kernelbake.signing.predicate import PREDICATE_TYPE
from kernelbake.signing.sign import attach_statement, sign_image
from kernelbake.signing.verify import verify_image
from tests.signing.conftest import ImageFactory, KeyPair
from tests.signing.images import PushedImage
from tests.signing.tamper import (
    delete_blob,
    drop_bundles,
    list_referrers,
    prepend_legacy_layers,
    push_referrer,
    replace_bundles,
)

pytestmark = pytest.mark.registry

FIVE_MIB = 5 << 20
SBOM = "application/vnd.example.sbom.v1+json"


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every body byte the registry client reads, whatever the request."""
    seen: list[int] = []
    real = requests.Response.iter_content

    def counting(self: requests.Response, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for chunk in real(self, *args, **kwargs):
            seen.append(len(chunk))
            yield chunk

    monkeypatch.setattr(requests.Response, "iter_content", counting)
    yield seen


def _gone_blob(client: RegistryClient, image: PushedImage) -> tuple[str, list[dict[str, Any]]]:
    blob = json.dumps({"mediaType": formats.BUNDLE_V03, "junk": image.digest}).encode()
    entry = push_referrer(client, image, blob)
    delete_blob(image, sha256_digest(blob))
    return "is gone", [entry]


def _big_bundle(client: RegistryClient, image: PushedImage) -> tuple[str, list[dict[str, Any]]]:
    entry = push_referrer(client, image, b"{" + b" " * FIVE_MIB + b"}")
    return f"over the {discover.MAX_ARTIFACT_BYTES}-byte limit", [entry]


def _big_bundle_declared_small(
    client: RegistryClient, image: PushedImage
) -> tuple[str, list[dict[str, Any]]]:
    # The manifest lies about the layer's size: the limit holds on what the registry sends.
    entry = push_referrer(client, image, b"[" + b" " * FIVE_MIB + b"]", declared_size=900)
    return f"over the {discover.MAX_ARTIFACT_BYTES}-byte limit", [entry]


def _other_types_first(client: RegistryClient, image: PushedImage) -> tuple[str, list[dict[str, Any]]]:
    entries = [
        push_referrer(client, image, b'{"sbom": %d}' % i, artifact_type=SBOM, layer_type=SBOM)
        for i in range(64)
    ]
    return f"64 times: not a Sigstore bundle (artifactType '{SBOM}')", entries


def _junk_bundles_first(client: RegistryClient, image: PushedImage) -> tuple[str, list[dict[str, Any]]]:
    # Bundle-typed but no signature; no predicate annotation, so the real ones are tried first.
    entries = [push_referrer(client, image, b'{"junk": %d}' % i) for i in range(64)]
    examined = discover.MAX_BUNDLES - 2
    return f"{64 - examined} times: not examined: only {discover.MAX_BUNDLES} candidate bundles are", entries


Junk = Callable[[RegistryClient, PushedImage], tuple[str, list[dict[str, Any]]]]
JUNK: dict[str, Junk] = {
    "blob-deleted": _gone_blob,
    "5MiB-bundle": _big_bundle,
    "5MiB-bundle-declared-900-bytes": _big_bundle_declared_small,
    "64-other-artifact-types-first": _other_types_first,
    "64-junk-bundles-first": _junk_bundles_first,
}


@pytest.mark.parametrize("position", ["listed-first", "listed-last"])
@pytest.mark.parametrize("kind", list(JUNK))
def test_a_signed_image_verifies_next_to_junk(
    make_image: ImageFactory,
    client: RegistryClient,
    keys: KeyPair,
    kind: str,
    position: str,
    bytes_read: list[int],
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    expected, entries = JUNK[kind](client, image)
    list_referrers(client, image, entries, first=position == "listed-first")
    fresh = RegistryClient(client.settings, timeout=10.0)  # nothing cached from the pushes
    bytes_read.clear()

    verified = verify_image(image.pinned, keys.policy(), client=fresh)

    assert verified.signer == f"key {keys.public.fingerprint}"
    assert verified.attestation["key"] == str(image.key)
    note = verified.skipped_note()
    assert note is not None and note.startswith(f"skipped {len(entries)} attached artifact")
    assert expected in note, note
    # Neither a 5 MiB blob nor 64 referrers' worth of junk is downloaded.
    assert sum(bytes_read) < 1 << 20, sum(bytes_read)


def test_cli_says_what_it_skipped(
    make_image: ImageFactory,
    client: RegistryClient,
    keys: KeyPair,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    _, entries = _gone_blob(client, image)
    list_referrers(client, image, entries)
    assert main(["verify", image.tagged, "--key", str(keys.public_path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"verified {image.pinned}: signed by key ")
    assert err.startswith("kernelbake verify: note: skipped 1 attached artifact: ")
    assert "is gone" in err and len(err.splitlines()) == 1
    assert main(["verify", image.tagged, "--key", str(keys.public_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verified"] is True
    assert [s["count"] for s in doc["skipped"]] == [1] and "is gone" in doc["skipped"][0]["reason"]


def test_a_legacy_signature_is_enough_when_every_bundle_is_junk(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client, legacy=True)
    replace_bundles(client, image, b"not json at all")
    verified = verify_image(image.pinned, keys.policy(), client=client)
    assert verified.signer == f"key {keys.public.fingerprint}"
    note = verified.skipped_note()
    assert note is not None and note.startswith("skipped 2 attached artifacts") and "not JSON" in note


def test_a_trusted_signature_among_other_signers_and_junk(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, other_keys: KeyPair
) -> None:
    image = make_image()
    sign_image(image.tagged, other_keys.signer, client=client)
    sign_image(image.tagged, keys.signer, client=client)
    _, entries = _gone_blob(client, image)
    list_referrers(client, image, entries)
    verified = verify_image(image.pinned, keys.policy(), client=client)
    assert verified.signer == f"key {keys.public.fingerprint}"
    assert sum(s.count for s in verified.skipped) == 3  # the intruder's two bundles, the gone one


@pytest.mark.parametrize(
    ("kinds", "error", "start"),
    [
        # Nothing that could be read as a signature: unsigned, and what was there.
        (
            [
                "blob-deleted",
                "5MiB-bundle",
                "5MiB-bundle-declared-900-bytes",
                "64-other-artifact-types-first",
            ],
            Unsigned,
            "no usable signature found; skipped 67 attached artifacts: ",
        ),
        # Bundle-shaped junk: the best reason (a malformed bundle), and that the others were skipped.
        (list(JUNK), MalformedSignature, "no trusted signature: "),
    ],
)
def test_only_junk_fails_closed_with_the_reasons(
    make_image: ImageFactory,
    client: RegistryClient,
    keys: KeyPair,
    kinds: list[str],
    error: type[VerificationFailed],
    start: str,
) -> None:
    image = make_image()
    entries = [entry for kind in kinds for entry in JUNK[kind](client, image)[1]]
    list_referrers(client, image, entries)
    with pytest.raises(error) as failed:
        verify_image(image.pinned, keys.policy(), client=client)
    message = str(failed.value)
    assert type(failed.value) is error
    assert message.startswith(f"{image.pinned}: {start}"), message
    # Every entry is accounted for: the best candidate named, all others counted as skipped.
    others = len(entries) - (error is not Unsigned)
    assert f"skipped {others} {'attached' if error is Unsigned else 'other'} artifacts" in message
    assert "\n" not in message


def test_junk_next_to_an_untrusted_signature_names_the_signer(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, other_keys: KeyPair
) -> None:
    image = make_image()
    sign_image(image.tagged, other_keys.signer, client=client)
    _, entries = _other_types_first(client, image)
    list_referrers(client, image, entries)
    with pytest.raises(UntrustedSigner) as failed:
        verify_image(image.pinned, keys.policy(), client=client)
    message = str(failed.value)
    assert other_keys.public.fingerprint in message
    assert "skipped 65 other artifacts" in message and "64 times: not a Sigstore bundle" in message


def test_junk_that_copies_the_annotations_past_the_bound_fails_closed(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    # Whoever may push can always deny (delete the signature, or bury it under more than the bound
    # of look-alikes, listed as the newest); what matters is that this costs bounded work and says so.
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    annotations = {formats.ANN_BUNDLE_PREDICATE: intoto.COSIGN_SIGN_PREDICATE}
    entries = [
        push_referrer(client, image, b'{"junk": %d}' % i, annotations=annotations)
        for i in range(discover.MAX_BUNDLES)
    ]
    list_referrers(client, image, entries, first=False)
    with pytest.raises(MalformedSignature) as failed:
        verify_image(image.pinned, keys.policy(), client=client)
    assert f"not examined: only {discover.MAX_BUNDLES} candidate bundles are" in str(failed.value)


def test_legacy_layers_are_tried_newest_first_within_their_bound(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    # cosign appends each signature to .sig: older junk (or signatures by a rotated-out key)
    # beyond the bound does not hide the newest.
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client, legacy=True)
    drop_bundles(client, image)
    prepend_legacy_layers(client, image, discover.MAX_LEGACY_LAYERS + 4)
    verified = verify_image(image.pinned, keys.policy(), client=client)
    assert verified.signer == f"key {keys.public.fingerprint}"
    note = verified.skipped_note()
    assert note is not None and note.startswith(f"skipped {discover.MAX_LEGACY_LAYERS + 4} attached")
    assert f"5 times: not examined: only the newest {discover.MAX_LEGACY_LAYERS} layers are" in note
    assert "15 times: no trusted key" in note


@pytest.mark.parametrize("position", ["listed-first", "listed-last"])
def test_any_trusted_attestation_that_describes_the_image_is_enough(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, position: str
) -> None:
    image = make_image()
    predicate = sign_image(image.tagged, keys.signer, client=client).predicate
    assert predicate is not None
    # Another trusted attestation for this digest that describes another build.
    wrong = dataclasses.replace(predicate, cache_layer_digest="sha256:" + "e" * 64)
    digest = attach_statement(image.tagged, keys.signer, PREDICATE_TYPE, wrong.to_json(), client=client)
    ref = image.ref.with_digest(image.digest)
    entries = [d.to_json() for d in client.referrers(ref)]
    wrong_first = position == "listed-first"
    drop_bundles(client, image)
    list_referrers(client, image, sorted(entries, key=lambda e: (e["digest"] == digest) != wrong_first))
    verified = verify_image(image.pinned, keys.policy(), client=client)
    assert verified.attestation["cacheManifest"]["layerDigest"] == predicate.cache_layer_digest
    note = verified.skipped_note()
    if wrong_first:  # the oldest: the right one, newer, satisfied the policy before it was needed
        assert note is None
    else:  # the newest: tried first, and skipped
        assert note is not None and note.startswith("skipped 1 attached artifact: bundle sha256:")
        assert f"the attestation says sha256:{'e' * 64}" in note
