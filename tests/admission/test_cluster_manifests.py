"""docs/cluster.md's serving manifest, deploy/examples/serve.yaml, through the real webhook: the
server as a process over HTTPS (CA from deploy/make-cert.sh), the image pushed to the real local
docker-registry and signed by ``kernelbake sign``, the manifest wrapped in the AdmissionReview
the API server would send. Only the ``image:`` fields change (to the image this test pushed)."""

from __future__ import annotations

import copy
import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernelbake.contract.layout import MANIFEST
from kernelbake.oci import RegistryClient
from kernelbake.oci.types import sha256_digest
from kernelbake.plan import plan
from kernelbake.spec import load_spec
from tests.admission import documents, live
from tests.admission.test_cache_volumes import facts_of
from tests.conftest import REPO
from tests.signing.images import PushedImage, push_image, tiny_llama_target

pytestmark = pytest.mark.registry

SERVE = REPO / "deploy" / "examples" / "serve.yaml"


def manifest() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SERVE.read_text())
    return doc


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def with_image(obj: dict[str, Any], image: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    for c in containers(out):
        c["image"] = image
    return out


def review(obj: dict[str, Any]) -> dict[str, Any]:
    """The AdmissionReview the API server sends for ``kubectl apply`` of ``obj`` (a create)."""
    group, _, version = obj["apiVersion"].rpartition("/")
    kind = {"group": group, "version": version}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {**kind, "kind": obj["kind"]},
            "resource": {**kind, "resource": obj["kind"].lower() + "s"},
            "name": obj["metadata"]["name"],
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "you@example.com"},
            "object": obj,
        },
    }


class Webhook:
    def __init__(self, served: live.Served, certs: Path) -> None:
        self.served, self.certs = served, certs

    def post(self, path: str, doc: dict[str, Any]) -> dict[str, Any]:
        response: dict[str, Any] = live.post_review(self.served.port, self.certs, path, doc)["response"]
        return response


@pytest.fixture(scope="module")
def pushed(registry: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[PushedImage, Path]:
    tmp = tmp_path_factory.mktemp("cluster-manifests")
    key, pub = live.generate_key(tmp / "keys", "builder")
    # The image serve.yaml names: qwen3-0.6b baked for the H100 its nodeSelector pins.
    tag = manifest()["spec"]["template"]["spec"]["containers"][0]["image"].rsplit(":", 1)[1]
    image = live.push_target(registry, "kernelbake/qwen3-0.6b", tag, "h100", tmp / "h100")
    live.sign(image, key)
    return image, pub


@pytest.fixture(scope="module")
def webhook(
    registry: str, certs: Path, pushed: tuple[PushedImage, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Webhook]:
    policy = live.write_policy(
        tmp_path_factory.mktemp("cluster-policy") / "policy.yaml", [f"{registry}/kernelbake/**"], pushed[1]
    )
    with live.serving(policy, certs) as served:
        yield Webhook(served, certs)
        assert served.process.poll() is None, served.log


def test_the_manifest_is_what_the_walkthrough_says() -> None:
    obj = manifest()
    spec = obj["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    (serve,) = spec["containers"]
    assert serve["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert all(c["securityContext"]["readOnlyRootFilesystem"] is True for c in containers(obj))
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in serve["volumeMounts"]}
    assert mounts["/dev/shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert mounts["/tmp"]["emptyDir"] == {}
    (seed,) = spec["initContainers"]
    assert seed["command"][-2:] == ["seed-cache", seed["volumeMounts"][0]["mountPath"]]
    assert mounts["/opt/kernelbake/cache"] is volumes[seed["volumeMounts"][0]["name"]]
    # The image the manifest names is the one `kernelbake plan` gives qwen3-0.6b on an H100.
    (target,) = plan(
        load_spec(REPO / "images" / "qwen3-0.6b.yaml"), ["h100"], registry="registry.example.com/kernelbake"
    )
    assert serve["image"] == target.ref
    assert {c["image"] for c in containers(obj)} == {serve["image"]}


def test_the_serve_manifest_is_admitted_and_pinned_to_the_verified_digest(
    webhook: Webhook, pushed: tuple[PushedImage, Path]
) -> None:
    image = pushed[0]
    doc = review(with_image(manifest(), image.tagged))
    response = webhook.post("/mutate", doc)
    assert response["allowed"] is True, response
    patched = documents.apply_patch(doc, response)
    assert [c["image"] for c in containers(patched)] == [image.pinned, image.pinned]
    # What the API server stores after mutation passes the validating webhook unchanged.
    doc["request"]["object"] = patched
    assert webhook.post("/validate", doc) == {"uid": doc["request"]["uid"], "allowed": True}


def test_without_its_node_selector_the_manifest_is_denied_with_what_to_add(
    webhook: Webhook, pushed: tuple[PushedImage, Path]
) -> None:
    obj = with_image(manifest(), pushed[0].tagged)
    del obj["spec"]["template"]["spec"]["nodeSelector"]
    response = webhook.post("/mutate", review(obj))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "add nodeSelector nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3" in response["status"]["message"]


# --- deploy/stock-vllm: the unchanged engine image with kernelbake's caches ---------------------

STOCK = REPO / "deploy" / "stock-vllm"


@dataclasses.dataclass
class Stock:
    artifact: PushedImage  # tiny-llama's cache artifact, labelled as image-volume.yaml was written from
    image: PushedImage  # tiny-llama's full image of the same key (init-container.yaml's seed)
    pub: Path


def stock_manifest(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((STOCK / name).read_text())
    return doc


@pytest.fixture(scope="module")
def stock(registry: str, tmp_path_factory: pytest.TempPathFactory) -> Stock:
    tmp = tmp_path_factory.mktemp("stock-vllm")
    key, pub = live.generate_key(tmp / "keys", "builder")
    client = RegistryClient(timeout=30)
    target = tiny_llama_target()
    # The facts image-volume.yaml spells out (engine image, command, variables), on an artifact
    # whose manifest digest is the real one (push once to learn it: it depends on files and key).
    facts, _, _ = facts_of(stock_manifest("image-volume.yaml"))
    probe = push_image(
        client, f"{registry}/kb/probe:x", tmp / "probe", root_dir="", manifest_path=MANIFEST, target=target
    )
    facts = dataclasses.replace(facts, manifest_digest=sha256_digest(probe.cache_manifest))
    artifact = push_image(
        client,
        f"{registry}/kb/tiny-llama:v1-cache",
        tmp / "artifact",
        root_dir="",
        manifest_path=MANIFEST,
        labels={**dict(target.labels), **facts.labels()},
        target=target,
    )
    image = push_image(client, f"{registry}/kb/tiny-llama:v1", tmp / "image", target=target)
    live.sign(artifact, key)
    live.sign(image, key)
    return Stock(artifact, image, pub)


@pytest.fixture(scope="module")
def stock_webhook(
    registry: str, certs: Path, stock: Stock, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Webhook]:
    policy = live.write_policy(
        tmp_path_factory.mktemp("stock-policy") / "policy.yaml", [f"{registry}/kb/**"], stock.pub
    )
    with live.serving(policy, certs) as served:
        yield Webhook(served, certs)
        assert served.process.poll() is None, served.log


def _env(obj: dict[str, Any], name: str, value: str) -> None:
    for c in obj["spec"]["template"]["spec"]["containers"]:
        for e in c.get("env", []):
            if e["name"] == name:
                e["value"] = value


def test_the_image_volume_recipe_is_admitted_with_its_artifact_pinned(
    stock_webhook: Webhook, stock: Stock
) -> None:
    # Substituted: the artifact's reference (this registry, by tag) and the manifest digest the
    # artifact really has; the engine image, command and variables are the file's own.
    obj = stock_manifest("image-volume.yaml")
    (volume,) = [v for v in obj["spec"]["template"]["spec"]["volumes"] if "image" in v]
    volume["image"]["reference"] = stock.artifact.tagged
    _env(obj, "KERNELBAKE_MANIFEST_DIGEST", sha256_digest(stock.artifact.cache_manifest))
    doc = review(obj)
    response = stock_webhook.post("/mutate", doc)
    assert response["allowed"] is True, response
    patched = documents.apply_patch(doc, response)
    (pinned,) = [v for v in patched["spec"]["template"]["spec"]["volumes"] if "image" in v]
    assert pinned["image"]["reference"] == stock.artifact.pinned
    doc["request"]["object"] = patched
    assert stock_webhook.post("/validate", doc)["allowed"] is True
    # The same pod on another engine image than the caches were compiled in is denied.
    other = copy.deepcopy(patched)
    for c in containers(other):
        c["image"] = c["image"].split("@")[0] + "@sha256:" + "9" * 64
    denied = stock_webhook.post("/validate", review(other))
    assert denied["allowed"] is False and "run that image pinned by digest" in denied["status"]["message"]


def test_the_init_container_recipe_is_admitted_with_its_seed_image_pinned(
    stock_webhook: Webhook, stock: Stock
) -> None:
    # Substituted: the seeding init container's image (the model's full kernelbake image).
    obj = stock_manifest("init-container.yaml")
    (seed,) = obj["spec"]["template"]["spec"]["initContainers"]
    seed["image"] = stock.image.tagged
    doc = review(obj)
    response = stock_webhook.post("/mutate", doc)
    assert response["allowed"] is True, response
    patched = documents.apply_patch(doc, response)
    assert patched["spec"]["template"]["spec"]["initContainers"][0]["image"] == stock.image.pinned
    # Unsigned, it is denied.
    unsigned = copy.deepcopy(obj)
    unsigned["spec"]["template"]["spec"]["initContainers"][0]["image"] = stock.artifact.ref.name + ":nope"
    assert stock_webhook.post("/mutate", review(unsigned))["allowed"] is False
