"""A signed GPU index in the real docker-registry: ``kernelbake verify`` checks it and every
variant, ``inspect`` shows its table, and ``kernelbake admission review`` sends a pod pinned to
an H200 to the H200 variant; an index edited after signing fails both."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kernelbake.contract.variants import ANNOTATION_DEVICE, ANNOTATION_KEY, OCI_INDEX, encode
from kernelbake.gfd import PRODUCT
from kernelbake.oci import Reference, RegistryClient, parse_reference
from kernelbake.publish.index import publish_index
from tests.admission import documents, live
from tests.signing.images import PushedImage

pytestmark = pytest.mark.registry
REPOSITORY = "kernelbake/fleet-signed"
GPUS = ("h100", "h200", "a100-80gb")


@dataclasses.dataclass(frozen=True)
class Signed:
    registry: str
    index: str  # repo:tag@digest
    variants: dict[str, PushedImage]
    public_key: Path
    policy: Path

    @property
    def tagged(self) -> str:
        return self.index.partition("@")[0]


@pytest.fixture(scope="module")
def signed(registry: str, tmp_path_factory: pytest.TempPathFactory) -> Signed:
    tmp = tmp_path_factory.mktemp("signed-fleet")
    variants = {gpu: live.push_target(registry, REPOSITORY, gpu, gpu, tmp / gpu) for gpu in GPUS}
    index = publish_index([v.pinned for v in variants.values()])
    private, public = live.generate_key(tmp, "fleet")
    live.kernelbake("sign", "--key", str(private), index)
    policy = live.write_policy(tmp / "policy.yaml", [f"{registry}/kernelbake/**"], public)
    return Signed(registry, index, variants, public, policy)


def tampered(signed: Signed, tag: str, edit: str) -> str:
    """The signed index with its H100 and H200 entries' keys swapped (``swap``: the H200 entry
    now names the H100 image under the H200 key, consistently annotated), or one entry's device
    annotation edited (``device``), pushed under ``tag``."""
    client = RegistryClient(timeout=30)
    doc = json.loads(json.dumps(client.get_manifest(parse_reference(signed.index)).doc))
    by_digest = {d["digest"]: d for d in doc["manifests"]}
    h100 = by_digest[signed.variants["h100"].digest]
    h200 = by_digest[signed.variants["h200"].digest]
    if edit == "swap":
        h100["annotations"], h200["annotations"] = h200["annotations"], h100["annotations"]
    else:
        h100["annotations"][ANNOTATION_DEVICE] = "NVIDIA H200"
    ref = parse_reference(signed.index)
    result = client.put_manifest(Reference(ref.registry, ref.repository, tag=tag), encode(doc), OCI_INDEX)
    return f"{ref.name}:{tag}@{result.digest}"


def test_verify_checks_the_index_and_every_variant(signed: Signed) -> None:
    done = live.kernelbake("verify", signed.index, "--key", str(signed.public_key))
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"verified index {parse_reference(signed.index).pinned()}: signed by")
    assert len(lines) == 1 + len(GPUS)
    for gpu, image in signed.variants.items():
        assert any(line.startswith("verified ") and image.pinned in line for line in lines[1:]), gpu
    doc = json.loads(
        live.kernelbake("verify", signed.tagged, "--key", str(signed.public_key), "--json").stdout
    )
    assert doc["verified"] is True and doc["index"]["verified"] is True
    assert {v["digest"] for v in doc["variants"] if v["verified"]} == {
        v.digest for v in signed.variants.values()
    }


def test_inspect_shows_the_variants_table(signed: Signed) -> None:
    done = live.kernelbake("inspect", signed.index)
    assert "index lists" not in done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].split() == ["kind", "device", "arch", "engine", "key", "digest", "digest"]
    for image in signed.variants.values():
        assert any(image.digest in line and line.split()[0] == "image" for line in lines[2:])
    doc = json.loads(live.kernelbake("inspect", signed.index, "--json").stdout)
    assert [v["platform"] for v in doc["variants"]] == ["linux/amd64/kernelbake-sm_90a"] * 2 + [
        "linux/amd64/kernelbake-sm_80"
    ]


def test_admission_sends_a_pod_pinned_to_an_h200_to_the_h200_variant(signed: Signed, tmp_path: Path) -> None:
    doc = documents.schedule(
        documents.load("pod-create", signed.tagged), node_selector={PRODUCT: "NVIDIA-H200"}
    )
    request = tmp_path / "request.json"
    request.write_text(json.dumps(doc))
    done = live.kernelbake("admission", "review", "--policy", str(signed.policy), str(request), check=False)
    assert done.returncode == 0, done.stderr
    response = json.loads(done.stdout)["response"]
    assert response["allowed"] is True, response
    image = documents.apply_patch(doc, response)["spec"]["containers"][0]["image"]
    assert image == signed.variants["h200"].pinned
    # Pinned to both GPUs: denied with the selector to add.
    both = documents.schedule(
        documents.load("pod-create", signed.tagged),
        terms=[{"matchExpressions": [documents.expr(PRODUCT, "In", "NVIDIA-H200", "NVIDIA-H100-80GB-HBM3")]}],
    )
    done = live.kernelbake(
        "admission", "review", "--policy", str(signed.policy), "-", check=False, stdin=json.dumps(both)
    )
    assert done.returncode == 1
    assert "need different variants" in json.loads(done.stdout)["response"]["status"]["message"]


def test_an_index_edited_after_signing_fails_verify_and_admission(signed: Signed, tmp_path: Path) -> None:
    swapped = tampered(signed, "swapped", "swap")
    done = live.kernelbake("verify", swapped, "--key", str(signed.public_key), check=False)
    # Its new digest carries no signature: the index's own line fails first (exit 11).
    assert done.returncode == 11, done.stderr
    assert done.stdout.splitlines()[0].startswith("FAILED   index")
    h200_line = next(line for line in done.stdout.splitlines() if signed.variants["h100"].digest in line)
    assert h200_line.startswith("FAILED   NVIDIA H200 (sm_90a)")
    assert "claims key" in h200_line and "but it verifies as" in h200_line
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1

    edited = tampered(signed, "edited", "device")
    done = live.kernelbake("verify", edited, "--key", str(signed.public_key), check=False)
    assert done.returncode == 18, done.stderr
    assert f"annotations disagree with {ANNOTATION_KEY} on" in done.stderr

    doc = documents.schedule(
        documents.load("pod-create", swapped.partition("@")[0]), node_selector={PRODUCT: "NVIDIA-H200"}
    )
    done = live.kernelbake(
        "admission", "review", "--policy", str(signed.policy), "-", check=False, stdin=json.dumps(doc)
    )
    assert done.returncode == 1
    assert "no signature" in json.loads(done.stdout)["response"]["status"]["message"]
