"""Image volumes (``spec.volumes[].image.reference``) are reviewed like containers: verified with
the policy's trust, pinned by digest, denied when unsigned (issue 20, item 2). The attack: an
unsigned image from a governed repository mounted over the cache root of a signed container."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from kernelbake.admission.admit import Endpoint
from kernelbake.admission.policy import load_admission_policy
from kernelbake.admission.rules import image_volume
from kernelbake.admission.rules.image_volume import UNJUDGED
from kernelbake.admission.service import Admitter
from kernelbake.admission.verifying import build_gateway
from kernelbake.contract.key import CacheKey
from kernelbake.gfd import PRODUCT
from kernelbake.oci import RegistryClient
from kernelbake.plan import plan
from kernelbake.settings import Settings
from kernelbake.signing.keys import generate_key_pair, load_private_key
from kernelbake.signing.sign import sign_image
from kernelbake.signing.signer import KeySigner
from kernelbake.spec import load_spec
from tests.admission import documents, live
from tests.admission.documents import H100
from tests.admission.fakes import REGISTRY, REPO, FakeVerifier, digest_of, make_admitter, make_policy
from tests.conftest import REPO as SOURCE_TREE
from tests.signing.images import PushedImage, push_image
from tests.support.memregistry import memory_registry

TAG = f"{REPO}:h100"
DIGEST = digest_of(TAG)
CACHE = f"{REGISTRY}/kernelbake/qwen3-0.6b-cache:h100"
CACHE_DIGEST = digest_of(CACHE)
UNSIGNED = f"{REGISTRY}/kernelbake/qwen3-0.6b-cache:unsigned"


@pytest.fixture
def verifier(verifier: FakeVerifier, keys: dict[str, CacheKey]) -> FakeVerifier:
    verifier.add(CACHE, keys["h100"])
    return verifier


def answer(
    verifier: FakeVerifier, doc: Any, endpoint: Endpoint = Endpoint.MUTATE, **policy: Any
) -> dict[str, Any]:
    out = make_admitter(verifier, make_policy(**policy) if policy else None).review(doc, endpoint)
    response: dict[str, Any] = out["response"]
    assert response["uid"] == doc["request"]["uid"]
    return response


def ops(response: dict[str, Any]) -> list[dict[str, Any]]:
    decoded: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return decoded


def test_an_unsigned_image_volume_over_a_signed_containers_cache_is_denied(verifier: FakeVerifier) -> None:
    doc = documents.add_image_volume(documents.load("pod-create", TAG), UNSIGNED)
    for endpoint in Endpoint:
        response = answer(verifier, doc, endpoint)
        assert response["allowed"] is False, response
        assert response["status"]["code"] == 403
        assert response["status"]["message"] == (
            f'kernelbake admission: image volume "kernel-cache": image {UNSIGNED} was rejected: '
            f"{UNSIGNED} has no signature from a trusted identity"
        )
    assert UNSIGNED in verifier.calls


def test_a_signed_image_volume_is_pinned_to_the_verified_digest(verifier: FakeVerifier) -> None:
    doc = documents.add_image_volume(documents.load("pod-create", TAG), CACHE)
    response = answer(verifier, doc)
    assert response["allowed"] is True, response
    assert [op["path"] for op in ops(response)] == [
        "/spec/containers/0/image",
        "/spec/volumes/1/image/reference",
    ]
    pod = documents.apply_patch(doc, response)
    assert pod["spec"]["volumes"][1]["image"] == {
        "reference": f"{REGISTRY}/kernelbake/qwen3-0.6b-cache@{CACHE_DIGEST}",
        "pullPolicy": "IfNotPresent",
    }
    # The guarantee says where it ends: the volume's GPU fit is not judged.
    assert response["warnings"] == [f'image volume "kernel-cache": image {CACHE}: {UNJUDGED}']
    assert sorted(verifier.calls) == sorted([TAG, CACHE])
    # What the validating webhook sees after mutation passes, and is not patched again.
    doc["request"]["object"] = pod
    validated = answer(verifier, doc, Endpoint.VALIDATE)
    assert validated["allowed"] is True and "patch" not in validated


def test_a_kernelbake_image_as_an_image_volume_is_admitted_with_the_warning_that_the_docs_give(
    verifier: FakeVerifier,
) -> None:
    """What the webhook does with a volume that verifies as a kernelbake image (CACHE has no
    cache-artifact facts here): admitted, pinned, and warned that its fit is not judged; the
    signature is what fails closed. docs/image-volumes.md's table and the image_volume rule's
    docstring (a docstring of the cache checks once said such a volume is refused) say the same as
    the answer."""
    doc = documents.add_image_volume(documents.load("pod-create", TAG), CACHE)
    response = answer(verifier, doc)
    assert response["allowed"] is True, response
    assert response["warnings"] == [f'image volume "kernel-cache": image {CACHE}: {UNJUDGED}']
    assert documents.apply_patch(doc, response)["spec"]["volumes"][1]["image"]["reference"].endswith(
        CACHE_DIGEST
    )
    table = (SOURCE_TREE / "docs" / "image-volumes.md").read_text().splitlines()
    row = next(line for line in table if line.startswith("| a kernelbake image"))
    assert row.split(" | ")[-1] == f"allowed and pinned, with the warning `{UNJUDGED}` |"
    said = " ".join((image_volume.__doc__ or "").split())
    assert "refused" not in said.split("kernelbake image", 1)[1].split(".", 1)[0]
    assert "The webhook admits it, pinned, with the warning ``UNJUDGED``" in said


@pytest.mark.parametrize("pull_policy", ["Always", "IfNotPresent", "Never"])
def test_the_pull_policy_does_not_change_the_review(verifier: FakeVerifier, pull_policy: str) -> None:
    doc = documents.add_image_volume(documents.load("pod-create", TAG), UNSIGNED, pull_policy=pull_policy)
    assert answer(verifier, doc)["allowed"] is False
    doc = documents.add_image_volume(documents.load("pod-create", TAG), CACHE, pull_policy=pull_policy)
    pod = documents.apply_patch(doc, answer(verifier, doc))
    assert pod["spec"]["volumes"][1]["image"]["reference"].endswith(CACHE_DIGEST)


def _as_kind(doc: dict[str, Any], group: str, kind: str) -> dict[str, Any]:
    doc["request"]["kind"] = {"group": group, "version": "v1", "kind": kind}
    obj = doc["request"]["object"]
    obj["kind"] = kind
    if kind == "PodTemplate":
        doc["request"]["object"] = {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": obj["metadata"],
            "template": obj["spec"]["template"],
        }
    return doc


TEMPLATE = "/spec/template/spec"


@pytest.mark.parametrize(
    ("group", "kind", "spec_pointer"),
    [
        ("apps", "Deployment", TEMPLATE),
        ("apps", "StatefulSet", TEMPLATE),
        ("apps", "DaemonSet", TEMPLATE),
        ("apps", "ReplicaSet", TEMPLATE),
        ("batch", "Job", TEMPLATE),
        ("", "ReplicationController", TEMPLATE),
        ("", "PodTemplate", "/template/spec"),
    ],
)
def test_every_pod_template_kind_reviews_its_image_volumes(
    verifier: FakeVerifier, group: str, kind: str, spec_pointer: str
) -> None:
    doc = _as_kind(documents.load("deployment-create", TAG), group, kind)
    documents.add_image_volume(doc, UNSIGNED)
    response = answer(verifier, doc)
    assert response["allowed"] is False, response
    assert f'image volume "kernel-cache": image {UNSIGNED} was rejected' in response["status"]["message"]

    doc = _as_kind(documents.load("deployment-create", TAG), group, kind)
    documents.add_image_volume(doc, CACHE)
    response = answer(verifier, doc)
    assert response["allowed"] is True, response
    assert f"{spec_pointer}/volumes/0/image/reference" in [op["path"] for op in ops(response)]
    obj = documents.apply_patch(doc, response)
    spec = obj["template"]["spec"] if kind == "PodTemplate" else obj["spec"]["template"]["spec"]
    assert (
        spec["volumes"][0]["image"]["reference"] == f"{REGISTRY}/kernelbake/qwen3-0.6b-cache@{CACHE_DIGEST}"
    )


def test_cronjob_image_volumes_are_pinned_through_the_job_template(verifier: FakeVerifier) -> None:
    doc = documents.add_image_volume(documents.load("cronjob-create", TAG), UNSIGNED)
    assert answer(verifier, doc)["allowed"] is False
    doc = documents.add_image_volume(documents.load("cronjob-create", TAG), CACHE)
    response = answer(verifier, doc)
    assert "/spec/jobTemplate/spec/template/spec/volumes/0/image/reference" in [
        op["path"] for op in ops(response)
    ]


def test_a_volume_in_an_ungoverned_repository_is_treated_like_an_ungoverned_container_image(
    verifier: FakeVerifier,
) -> None:
    doc = documents.add_image_volume(
        documents.load("pod-create", f"{REPO}@{DIGEST}"), "quay.io/acme/models:v1"
    )
    assert answer(verifier, doc) == {"uid": doc["request"]["uid"], "allowed": True}
    assert verifier.calls == [f"{REPO}@{DIGEST}"]


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        (f"{REGISTRY}/kernelbake/qwen3-0.6b-cache", "has no tag or digest"),
        ("Not A Ref", "admits only references it can read"),
        (f"{REGISTRY}:80/kernelbake/qwen3-0.6b-cache:h100", "write it as"),
        (f"{REGISTRY}/kernelbake/qwen3-0.6b-cache@sha512:{'b' * 128}", "sha256 digests only"),
    ],
)
def test_volume_references_that_cannot_be_verified_are_denied_before_any_registry_call(
    verifier: FakeVerifier, reference: str, expected: str
) -> None:
    doc = documents.add_image_volume(documents.load("pod-create", f"{REPO}@{DIGEST}"), reference)
    response = answer(verifier, doc)
    assert response["allowed"] is False
    assert response["status"]["message"].startswith('kernelbake admission: image volume "kernel-cache": ')
    assert expected in response["status"]["message"]
    assert verifier.calls == [f"{REPO}@{DIGEST}"]


def test_volumes_without_a_reference_and_other_volume_kinds_are_left_alone(verifier: FakeVerifier) -> None:
    doc = documents.load("pod-create", f"{REPO}@{DIGEST}")
    documents.pod_spec(doc)["volumes"] += [
        {"name": "empty", "image": {"reference": ""}},
        {"name": "defaulted", "image": {"pullPolicy": "Always"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    assert answer(verifier, doc) == {"uid": doc["request"]["uid"], "allowed": True}


@pytest.mark.parametrize(
    ("volumes", "expected"),
    [
        ({"name": "x"}, "spec.volumes must be a list"),
        (["cache"], "spec.volumes[0] must be an object"),
        ([{"name": "cache", "image": "x:1"}], 'volumes[0] ("cache").image must be an object'),
        (
            [{"name": "cache", "image": {"reference": 7}}],
            'volumes[0] ("cache").image.reference must be a string',
        ),
    ],
)
def test_malformed_volumes_are_denied_with_code_400(
    verifier: FakeVerifier, volumes: Any, expected: str
) -> None:
    doc = documents.load("pod-create", TAG)
    documents.pod_spec(doc)["volumes"] = volumes
    for mode in ("enforce", "warn"):
        response = answer(verifier, doc, mode=mode)
        assert response["allowed"] is False and response["status"]["code"] == 400
        assert expected in response["status"]["message"]


def test_a_volume_naming_a_gpu_index_is_pinned_to_the_variant_the_pod_runs_on(
    verifier: FakeVerifier, keys: dict[str, CacheKey]
) -> None:
    index = f"{REGISTRY}/kernelbake/qwen3-0.6b-cache:fleet"
    a100 = f"{REGISTRY}/kernelbake/qwen3-0.6b-cache:a100"
    verifier.add(a100, keys["a100-80gb"])
    verifier.add_index(index, {CACHE: keys["h100"], a100: keys["a100-80gb"]})
    doc = documents.add_image_volume(documents.load("pod-create", TAG), index)
    pod = documents.apply_patch(doc, answer(verifier, doc))
    assert pod["spec"]["volumes"][1]["image"]["reference"] == (
        f"{REGISTRY}/kernelbake/qwen3-0.6b-cache@{CACHE_DIGEST}"
    )
    documents.schedule(doc)
    response = answer(verifier, doc)
    assert response["allowed"] is False
    assert f'image volume "kernel-cache": image {index} names the GPU index' in response["status"]["message"]


def test_warn_mode_warns_about_an_unsigned_volume_and_pins_the_signed_ones(verifier: FakeVerifier) -> None:
    doc = documents.add_image_volume(documents.load("pod-create", TAG), UNSIGNED)
    documents.add_image_volume(doc, CACHE, name="second")
    response = answer(verifier, doc, mode="warn")
    assert response["allowed"] is True
    assert response["warnings"][0].startswith(
        f'kernelbake (warn mode) would deny: image volume "kernel-cache": image {UNSIGNED} was rejected'
    )
    assert [op["path"] for op in ops(response)] == [
        "/spec/containers/0/image",
        "/spec/volumes/2/image/reference",
    ]


def test_the_registry_down_denies_a_volume_with_503(verifier: FakeVerifier) -> None:
    doc = documents.add_image_volume(documents.load("pod-create", f"{REPO}@{DIGEST}"), CACHE)
    verifier.down = True
    response = answer(verifier, doc)
    assert response["allowed"] is False and response["status"]["code"] == 503
    assert (
        f'image volume "kernel-cache": image {CACHE} could not be verified' in response["status"]["message"]
    )


# --- UPDATE: volumes are part of the pod spec ----------------------------------------------


def _update(new_volume: str | None, old_volume: str | None) -> dict[str, Any]:
    doc = documents.load("deployment-create", f"{REPO}@{DIGEST}")
    if new_volume is not None:
        documents.add_image_volume(doc, new_volume)
    doc = documents.as_update(doc, old_image=f"{REPO}@{DIGEST}")
    old = documents.pod_spec(doc, "oldObject")
    old.pop("volumes", None)
    for c in old["containers"]:
        c.pop("volumeMounts", None)
    if old_volume is not None:
        documents.add_image_volume(doc, old_volume, which="oldObject")
    return doc


def test_an_update_that_adds_or_changes_a_volume_is_reviewed(verifier: FakeVerifier) -> None:
    response = answer(verifier, _update(UNSIGNED, None))
    assert response["allowed"] is False
    assert f'image volume "kernel-cache": image {UNSIGNED} was rejected' in response["status"]["message"]
    response = answer(verifier, _update(UNSIGNED, CACHE))
    assert response["allowed"] is False
    doc = _update(CACHE, f"{REGISTRY}/kernelbake/qwen3-0.6b-cache:old")
    response = answer(verifier, doc)
    assert response["allowed"] is True
    assert [op["path"] for op in ops(response)] == ["/spec/template/spec/volumes/0/image/reference"]


def test_an_unchanged_volume_in_a_changed_spec_is_verified_but_not_rewritten(verifier: FakeVerifier) -> None:
    doc = _update(CACHE, CACHE)
    documents.pod_spec(doc)["terminationGracePeriodSeconds"] = 60
    response = answer(verifier, doc)
    # Rewriting it would change the template, and roll the pods, for nothing.
    assert response["allowed"] is True and "patch" not in response
    assert CACHE in verifier.calls
    doc = _update(UNSIGNED, UNSIGNED)
    documents.pod_spec(doc)["terminationGracePeriodSeconds"] = 60
    assert answer(verifier, doc)["allowed"] is False


def test_an_update_that_leaves_the_spec_as_it_was_is_not_reviewed(verifier: FakeVerifier) -> None:
    doc = _update(UNSIGNED, UNSIGNED)
    doc["request"]["object"]["spec"]["replicas"] = 3
    assert answer(verifier, doc) == {"uid": doc["request"]["uid"], "allowed": True}
    assert verifier.calls == []


def test_a_gpu_pin_is_still_judged_for_the_containers_of_a_pod_with_volumes(verifier: FakeVerifier) -> None:
    doc = documents.add_image_volume(documents.load("pod-create", TAG), CACHE)
    documents.schedule(doc, node_selector={PRODUCT: "NVIDIA-A100-SXM4-80GB"})
    message = answer(verifier, doc)["status"]["message"]
    assert f'container "vllm": image {TAG} was baked for NVIDIA H100 80GB HBM3' in message
    assert f"add nodeSelector {PRODUCT}: {H100}" in message
    assert "image volume" not in message


def test_the_same_reference_as_container_and_volume_is_verified_once(verifier: FakeVerifier) -> None:
    doc = documents.add_image_volume(documents.load("pod-create", TAG), TAG)
    response = answer(verifier, doc)
    assert response["allowed"] is True
    assert verifier.calls == [TAG]
    pod = documents.apply_patch(doc, response)
    assert pod["spec"]["volumes"][1]["image"]["reference"] == pod["spec"]["containers"][0]["image"]


def test_documents_are_not_changed_by_the_review(verifier: FakeVerifier) -> None:
    doc = documents.add_image_volume(documents.load("pod-create", TAG), CACHE)
    before = copy.deepcopy(doc)
    answer(verifier, doc)
    assert doc == before


# --- the real verifier against an in-memory registry ------------------------------------------


def test_the_attack_against_real_signatures_in_an_in_memory_registry(tmp_path: Path) -> None:
    """Real images, a real signature, ``verify_image`` through ``build_gateway``: only the
    registry is in memory (tests/support/memregistry.py). The issue's attack, end to end: a
    signed serving image with an unsigned image of the same governed repository mounted over
    its cache root was admitted; it is denied, and a signed one is pinned."""
    settings = Settings(docker_config=tmp_path / "docker-config")
    client = RegistryClient(settings, timeout=30)
    private, public = generate_key_pair(tmp_path / "keys", name="trusted")
    signer = KeySigner(load_private_key(private))
    with memory_registry() as (registry, _):
        gpu = next(t for t in plan(load_spec(live.SPEC), ["h100"], registry=registry) if t.gpu.name == "h100")

        def push(tag: str) -> PushedImage:
            return push_image(
                client, f"{registry}/kernelbake/qwen3:{tag}", tmp_path / tag, target=gpu, salt=tag
            )

        serving, cache, unsigned = push("h100"), push("cache-h100"), push("cache-unsigned")
        for image in (serving, cache):
            sign_image(image.tagged, signer, client=client)
        policy_path = live.write_policy(tmp_path / "policy.yaml", [f"{registry}/kernelbake/**"], public)
        policy = load_admission_policy(policy_path)
        admitter = Admitter(policy, build_gateway(policy, settings=settings))
        try:
            attack = documents.add_image_volume(documents.load("pod-create", serving.tagged), unsigned.tagged)
            response = admitter.review(attack, Endpoint.MUTATE)["response"]
            assert response["allowed"] is False, response
            message = response["status"]["message"]
            assert message.startswith(
                f'kernelbake admission: image volume "kernel-cache": image {unsigned.tagged} was rejected: '
            ), message
            assert "no signature found" in message
            # The container itself was fine: the volume alone is named.
            assert 'container "vllm"' not in message

            doc = documents.add_image_volume(documents.load("pod-create", serving.tagged), cache.tagged)
            response = admitter.review(doc, Endpoint.MUTATE)["response"]
            assert response["allowed"] is True, response
            pod = documents.apply_patch(doc, response)
            assert pod["spec"]["containers"][0]["image"] == serving.pinned
            assert pod["spec"]["volumes"][1]["image"]["reference"] == cache.pinned
        finally:
            admitter.gateway.close()
