"""docs/cluster.md's serving manifest, deploy/examples/serve.yaml, through the real webhook: the
server as a process over HTTPS (CA from deploy/make-cert.sh), the image pushed to the real local
docker-registry and signed by ``kernelbake sign``, the manifest wrapped in the AdmissionReview
the API server would send. Only the ``image:`` fields change (to the image this test pushed)."""

from __future__ import annotations

import copy
import http.client
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernelbake.plan import plan
from kernelbake.spec import load_spec
from tests.admission import documents, live
from tests.admission.conftest import client_tls
from tests.conftest import REPO
from tests.signing.images import PushedImage

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
        conn = http.client.HTTPSConnection(
            "127.0.0.1", self.served.port, context=client_tls(self.certs), timeout=30
        )
        try:
            conn.request("POST", path, body=json.dumps(doc), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            assert r.status == 200, r.read()
            answer: dict[str, Any] = json.loads(r.read())
        finally:
            conn.close()
        response: dict[str, Any] = answer["response"]
        assert response["uid"] == doc["request"]["uid"]
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
