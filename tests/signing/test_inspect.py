"""``kernelbake inspect`` reads a pushed image through the code signing uses: the same digest,
labels and cache manifest; tolerant where signing is strict, and one line when it fails."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.errors import BadInput, EnvironmentProblem, KernelbakeError, RegistryError
from kernelbake.labels import GPU_LABEL
from kernelbake.oci import Descriptor, Manifest, RegistryClient, parse_reference
from kernelbake.oci import types as mt
from kernelbake.remote import (
    MAX_CACHE_LAYER_BYTES,
    ImageFacts,
    ImageLayoutError,
    read_cache_layer,
    read_cache_manifest,
    read_image,
)
from kernelbake.signing.errors import LabelMismatch
from kernelbake.signing.sign import sign_image
from kernelbake.signing.verify import verify_image
from tests.signing.conftest import ImageFactory, KeyPair
from tests.signing.images import tiny_llama_target
from tests.support.registry import free_port

pytestmark = pytest.mark.registry


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # inspect reads the environment itself: keep the host's docker credentials out.
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))


def _inspect_json(capsys: pytest.CaptureFixture[str], ref: str) -> dict[str, object]:
    assert main(["inspect", ref, "--json"]) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


def test_inspect_shows_what_the_attestation_describes(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    image = make_image()
    predicate = sign_image(image.tagged, keys.signer, client=client).predicate
    assert predicate is not None
    doc = _inspect_json(capsys, image.tagged)
    assert doc["ref"] == image.tagged and doc["digest"] == image.digest and doc["pullable"] == image.pinned
    assert doc["key"] == str(image.key)
    cm = doc["cache_manifest"]
    assert isinstance(cm, dict) and cm["key_matches_labels"] is True
    assert cm["digest"] == predicate.cache_manifest_digest
    assert cm["layer"] == predicate.cache_layer_digest


def test_extra_files_in_the_last_layer_are_shown_but_never_signed(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    image = make_image(last_layer_extra={"usr/lib/extra.so": b"\x7fELF"})
    cm = _inspect_json(capsys, image.tagged)["cache_manifest"]
    assert isinstance(cm, dict) and cm["key_matches_labels"] is True
    with pytest.raises(BadInput, match=re.escape("'usr/lib/extra.so'; it must hold only")):
        sign_image(image.tagged, keys.signer, client=client)


def test_no_cache_manifest_in_the_last_layer(
    make_image: ImageFactory, client: RegistryClient, capsys: pytest.CaptureFixture[str]
) -> None:
    # As an image built FROM a kernelbake image looks: someone else's layer comes last.
    image = make_image(last_layer_files={"usr/bin/tool": b"#!/bin/sh\n"})
    assert main(["inspect", image.tagged]) == 1
    assert "cache:      no cache manifest in the last layer" in capsys.readouterr().out.splitlines()
    top = client.get_manifest(image.ref)
    facts = read_image(client, image.ref.with_digest(top.digest), top)
    with pytest.raises(ImageLayoutError, match="holds 'usr/bin/tool'; it must hold only"):
        read_cache_manifest(client, facts)


@pytest.mark.parametrize(
    ("ref", "error", "match"),
    [
        ("127.0.0.1:{port}/kb/x:v1", EnvironmentProblem, "registry 127.0.0.1:{port} is unreachable"),
        ("{registry}/kb/not-pushed:v1", RegistryError, "not found"),
        ("{registry}/Kb/x:v1", BadInput, "bad repository"),
    ],
)
def test_inspect_fails_in_one_line_with_its_exit_code(
    registry: str,
    capsys: pytest.CaptureFixture[str],
    ref: str,
    error: type[KernelbakeError],
    match: str,
) -> None:
    port = free_port()
    rc = main(["inspect", ref.format(port=port, registry=registry)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == error.return_code
    assert len(err) == 1 and err[0].startswith("kernelbake inspect: error: ")
    assert match.format(port=port) in err[0]


class _NoBlobs(RegistryClient):
    def get_blob(self, *args: object, **kwargs: object) -> bytes:
        raise AssertionError("a layer too large to be a cache-manifest layer is not fetched")


def test_a_large_last_layer_is_not_fetched() -> None:
    layer = Descriptor(
        media_type=mt.OCI_LAYER_GZIP, digest="sha256:" + "1" * 64, size=MAX_CACHE_LAYER_BYTES + 1
    )
    config = Descriptor(media_type=mt.OCI_CONFIG, digest="sha256:" + "2" * 64, size=2)
    data = mt.encode_json(
        {
            "schemaVersion": 2,
            "mediaType": mt.OCI_MANIFEST,
            "config": config.to_json(),
            "layers": [layer.to_json()],
        }
    )
    manifest = Manifest.from_bytes(data, mt.OCI_MANIFEST, source="test")
    ref = parse_reference(f"127.0.0.1:1/kb/big@{manifest.digest}")
    cache = read_cache_layer(_NoBlobs(), ImageFacts(ref, manifest, manifest, {}))
    assert cache is not None and cache.manifest is None
    with pytest.raises(ImageLayoutError, match="bytes; it must hold only"):
        cache.manifest_alone()


def test_a_relabelled_gpu_is_inconsistent_and_other_labels_are_unattested(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tiny_llama_target()  # a CPU image
    honest = make_image()
    assert main(["inspect", honest.tagged]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "gpu:        cpu (from the key's device)" in lines
    assert f"key digest: {target.key.digest} (labels consistent with the key)" in lines
    assert f"  org.opencontainers.image.title={target.spec.name}" in lines

    relabelled = make_image(
        labels={**dict(target.labels), GPU_LABEL: "h100", "com.example.note": "added later"}
    )
    assert main(["inspect", relabelled.tagged]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "labels consistent" not in out and "h100 (from" not in out
    assert "gpu:        cpu (from the key's device)" in lines
    assert f"key digest: {target.key.digest} (labels INCONSISTENT with the key)" in lines
    assert "  label dev.kernelbake.gpu='h100', but the key's device 'cpu' gives 'cpu'" in lines
    unattested = lines.index("unattested: (labels outside the key; nothing checks them)")
    assert "  com.example.note=added later" in lines[unattested:]
    doc = _inspect_json(capsys, relabelled.tagged)
    assert doc["gpu"] == "cpu" and doc["labels_consistent"] is False
    assert doc["unattested_labels"] == {
        k: v
        for k, v in sorted({**dict(target.labels), "com.example.note": "added later"}.items())
        if not k.startswith("dev.kernelbake.")
    }

    # Neither attested nor verified as it stands.
    with pytest.raises(BadInput, match=f"label {GPU_LABEL}='h100'"):
        sign_image(relabelled.tagged, keys.signer, client=client)
    sign_image(relabelled.tagged, keys.signer, client=client, attest=False)
    with pytest.raises(LabelMismatch, match=f"label {GPU_LABEL}='h100'"):
        verify_image(relabelled.tagged, keys.policy(require_attestation=False), client=client)
