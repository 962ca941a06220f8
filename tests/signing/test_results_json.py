"""Results serialise themselves (``VerifiedImage``, ``IndexVerification``, ``Inspection``,
``IndexListing``), and the CLI's ``--json`` stays byte for byte what it printed when the CLI
built the documents itself: the ``_before_*`` functions are that code, kept as the reference."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from kernelbake.cli import main
from kernelbake.contract.artifact import ArtifactKind, artifact_facts, kind_of
from kernelbake.fleet import FleetIndex, read_index
from kernelbake.labels import check_labels
from kernelbake.oci import RegistryClient, parse_reference
from kernelbake.plan import plan
from kernelbake.publish.index import publish_index
from kernelbake.remote import RemoteImage, inspect_remote
from kernelbake.signing.index import IndexVerification, verify_index
from kernelbake.signing.sign import sign_image
from kernelbake.signing.verify import VerifiedImage, verify_image
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.signing.conftest import ImageFactory, KeyPair
from tests.signing.images import push_image


@pytest.fixture(scope="session")
def image_registry(memory_registry: str) -> str:
    return memory_registry


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))


def _before_verify(result: VerifiedImage) -> dict[str, Any]:
    return {
        "verified": True,
        "reference": result.reference,
        "repository": result.repository,
        "digest": result.digest,
        "key": str(result.key),
        "key_digest": result.key.digest,
        "cache_manifest_digest": result.manifest_digest,
        "signer": result.signer,
        "attestation": dict(result.attestation),
        "skipped": [{"origin": s.origin, "reason": s.reason, "count": s.count} for s in result.skipped],
    }


def _before_verify_index(reference: str, index: FleetIndex, done: IndexVerification) -> dict[str, Any]:
    sig = done.signature
    return {
        "verified": done.ok,
        "reference": reference,
        "index": {
            "digest": index.ref.digest,
            "verified": sig is not None,
            "signer": sig.signer if sig else None,
            "error": str(done.signature_failure) if done.signature_failure else None,
            "skipped": [{"origin": s.origin, "reason": s.reason, "count": s.count} for s in sig.skipped]
            if sig
            else [],
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
            for r in done.variants
        ],
    }


def _before_inspect(image: RemoteImage) -> dict[str, Any]:
    checked = check_labels(image.labels)
    key = checked.key
    artifact = None
    if kind_of(image.labels) is ArtifactKind.CACHE:
        artifact = artifact_facts(image.labels, source=str(image.ref))
    artifact_labels = artifact.labels() if artifact is not None else {}
    doc: dict[str, Any] = {
        "ref": str(image.ref),
        "digest": image.digest,
        "pullable": f"{image.ref.registry}/{image.ref.repository}@{image.digest}",
        "key": str(key),
        "key_digest": key.digest,
        "gpu": checked.gpu.name if checked.gpu is not None else None,
        "labels": dict(sorted(checked.derived.items())),
        "labels_consistent": checked.consistent,
        "label_problems": list(checked.problems),
        "unattested_labels": {k: v for k, v in checked.unattested.items() if k not in artifact_labels},
        "artifact": artifact.to_json() if artifact is not None else None,
        "layers": len(image.layers),
        "cache_manifest": None,
    }
    m = image.cache_manifest
    if m is not None:
        doc["cache_manifest"] = {
            "digest": image.cache_manifest_digest,
            "layer": image.layers[-1],
            "key_matches_labels": m.key == key,
            "files": len(m.files),
            "kinds": m.totals(),
            "builder": dict(m.compile_report).get("builder"),
        }
    return doc


def _before_index_listing(reference: str, index: FleetIndex) -> dict[str, Any]:
    rows = [
        {
            "device": v.key.device,
            "arch": v.key.arch,
            "engine": f"{v.key.engine.value} {v.key.engine_version}",
            "key_digest": v.key.digest,
            "digest": v.digest,
            "kind": v.kind.value,
            "platform": "/".join(filter(None, (v.os, v.architecture, v.platform().get("variant")))),
        }
        for v in index.variants
    ]
    return {"reference": reference, "index": index.ref.pinned(), "variants": rows}


def _printed(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"


def _fleet(image_registry: str, client: RegistryClient, tmp_path: Path) -> FleetIndex:
    repo = f"{image_registry}/kb/fleet-{uuid.uuid4().hex[:8]}"
    targets = {t.gpu.name: t for t in plan(load_spec(REPO / "images" / "qwen3-0.6b.yaml"), ["h100", "h200"])}
    pushed = [
        push_image(client, f"{repo}:{gpu}", tmp_path / gpu, target=t, salt=gpu).pinned
        for gpu, t in targets.items()
    ]
    index = read_index(publish_index(pushed, client=client), client=client)
    assert index is not None
    return index


def test_verify_json_is_what_the_cli_printed_before(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    capsys.readouterr()
    assert main(["verify", image.tagged, "--key", str(keys.public_path), "--json"]) == 0
    printed = capsys.readouterr().out
    result = verify_image(image.tagged, keys.policy(), client=client)
    assert printed == _printed(_before_verify(result)) == _printed(result.to_json())


def test_index_verify_json_with_a_failing_variant_is_what_the_cli_printed_before(
    image_registry: str,
    client: RegistryClient,
    keys: KeyPair,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    index = _fleet(image_registry, client, tmp_path)
    # The index and one variant signed: the other's failure is in the document too.
    sign_image(index.pinned(index.variants[0]), keys.signer, client=client)
    sign_image(index.ref.pinned(), keys.signer, client=client, attest=False)
    reference = index.ref.pinned()
    capsys.readouterr()
    assert main(["verify", reference, "--key", str(keys.public_path), "--json"]) != 0
    printed = capsys.readouterr().out
    done = verify_index(index, keys.policy(), client)
    assert not done.ok
    assert (
        printed == _printed(_before_verify_index(reference, index, done)) == _printed(done.to_json(reference))
    )


def test_inspect_json_of_an_image_and_an_index_is_what_the_cli_printed_before(
    make_image: ImageFactory,
    image_registry: str,
    client: RegistryClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kernelbake.inspection import IndexListing, Inspection

    image = make_image()
    capsys.readouterr()
    assert main(["inspect", image.tagged, "--json"]) == 0
    remote = inspect_remote(image.tagged, client=client)
    assert (
        capsys.readouterr().out == _printed(_before_inspect(remote)) == _printed(Inspection(remote).to_json())
    )
    index = _fleet(image_registry, client, tmp_path)
    reference = f"{index.ref.registry}/{index.ref.repository}@{index.ref.digest}"
    assert parse_reference(reference).digest == index.ref.digest
    assert main(["inspect", reference, "--json"]) == 0
    printed = capsys.readouterr().out
    assert printed == _printed(_before_index_listing(reference, index))
    assert printed == _printed(IndexListing(reference, index).to_json())
