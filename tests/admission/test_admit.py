"""The webhook core end to end (document in, document out) with an injected verifier."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kernelbake.admission.admit import Endpoint
from kernelbake.contract.key import CacheKey
from kernelbake.gfd import PRODUCT
from tests.admission import documents
from tests.admission.documents import H100, expr
from tests.admission.fakes import REPO, FakeVerifier, digest_of, make_admitter, make_policy

TAG = f"{REPO}:h100"
DIGEST = digest_of(TAG)


def answer(
    verifier: FakeVerifier, doc: Any, endpoint: Endpoint = Endpoint.MUTATE, **policy: Any
) -> dict[str, Any]:
    out = make_admitter(verifier, make_policy(**policy) if policy else None).review(doc, endpoint)
    response: dict[str, Any] = out["response"]
    assert out["apiVersion"] == "admission.k8s.io/v1"
    assert out["kind"] == "AdmissionReview"
    return response


def test_pod_with_a_signed_image_on_its_gpu_is_pinned_to_the_verified_digest(verifier: FakeVerifier) -> None:
    doc = documents.load("pod-create", TAG)
    response = answer(verifier, doc)
    assert response["uid"] == doc["request"]["uid"]
    assert response["allowed"] is True
    obj = documents.apply_patch(doc, response)
    assert obj["spec"]["containers"][0]["image"] == f"{REPO}@{DIGEST}"
    assert verifier.calls == [TAG]


def test_deployment_patches_go_through_the_template_and_skip_ungoverned_images(
    verifier: FakeVerifier,
) -> None:
    doc = documents.load("deployment-create", TAG)
    response = answer(verifier, doc)
    assert response["allowed"] is True, response
    ops = json.loads(base64.b64decode(response["patch"]))
    assert [op["path"] for op in ops] == [
        "/spec/template/spec/initContainers/0/image",
        "/spec/template/spec/containers/0/image",
    ]
    obj = documents.apply_patch(doc, response)
    assert (
        obj["spec"]["template"]["spec"]["containers"][1]["image"] == "docker.io/prom/statsd-exporter:v0.28.0"
    )
    # Same reference twice in one pod: verified once.
    assert verifier.calls == [TAG]


def test_cronjob_patches_go_through_the_job_template(verifier: FakeVerifier) -> None:
    doc = documents.load("cronjob-create", TAG)
    response = answer(verifier, doc)
    obj = documents.apply_patch(doc, response)
    pod = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == f"{REPO}@{DIGEST}"


@pytest.mark.parametrize("kind", ["StatefulSet", "DaemonSet", "ReplicaSet", "Job"])
def test_other_pod_templates(verifier: FakeVerifier, kind: str) -> None:
    doc = documents.load("deployment-create", TAG)
    group = "batch" if kind == "Job" else "apps"
    doc["request"]["kind"] = {"group": group, "version": "v1", "kind": kind}
    doc["request"]["object"]["kind"] = kind
    response = answer(verifier, doc)
    assert response["allowed"] is True
    assert documents.apply_patch(doc, response)["spec"]["template"]["spec"]["containers"][0][
        "image"
    ].endswith(DIGEST)
    documents.schedule(doc)
    assert answer(verifier, doc)["allowed"] is False


def test_ephemeral_containers_are_checked(verifier: FakeVerifier) -> None:
    doc = documents.as_update(documents.load("pod-create", TAG), old_image=TAG)
    doc["request"]["subResource"] = "ephemeralcontainers"
    spec = doc["request"]["object"]["spec"]
    spec["ephemeralContainers"] = [
        {"name": "debugger", "image": f"{REPO}:unsigned", "targetContainerName": "vllm"}
    ]
    response = answer(verifier, doc)
    assert response["allowed"] is False
    assert (
        'ephemeral container "debugger": image registry.example.com/kernelbake/qwen3-0.6b:unsigned was rejected'
        in response["status"]["message"]
    )


def test_unsigned_and_wrong_signer_are_denied_with_the_verifier_reason(verifier: FakeVerifier) -> None:
    response = answer(verifier, documents.load("pod-create", f"{REPO}:unsigned"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "has no signature from a trusted identity" in response["status"]["message"]
    verifier.wrong_signer.add(TAG)
    response = answer(verifier, documents.load("pod-create", TAG))
    assert response["allowed"] is False
    assert "signed by mallory@example.com, not a trusted identity" in response["status"]["message"]


def test_gpu_mismatch_is_denied_with_compat_reasons(verifier: FakeVerifier) -> None:
    doc = documents.schedule(
        documents.load("pod-create", TAG), node_selector={PRODUCT: "NVIDIA-A100-SXM4-80GB"}
    )
    response = answer(verifier, doc)
    message = response["status"]["message"]
    assert response["allowed"] is False
    assert "was baked for NVIDIA H100 80GB HBM3 (sm_90a)" in message
    assert "arch: baked 'sm_90a', found 'sm_80' (kernels are compiled for one GPU architecture)" in message
    assert f"add nodeSelector {PRODUCT}: {H100}" in message


def test_no_gpu_constraint_is_denied_with_the_node_selector_to_add(verifier: FakeVerifier) -> None:
    doc = documents.schedule(documents.load("pod-create", TAG))
    message = answer(verifier, doc)["status"]["message"]
    assert message == (
        f'kernelbake admission: container "vllm": image {TAG} was baked for NVIDIA H100 80GB HBM3 (sm_90a) '
        f"but the pod (no nodeSelector, no required node affinity) does not pin a GPU; "
        f"add nodeSelector {PRODUCT}: {H100} "
        "(judged from the image's key, the fallback: vLLM's own cache check runs at kernelbake serve)"
    )


def test_affinity_terms_are_ored(verifier: FakeVerifier) -> None:
    doc = documents.schedule(
        documents.load("pod-create", TAG), terms=[{"matchExpressions": [expr(PRODUCT, "In", H100)]}]
    )
    assert answer(verifier, doc)["allowed"] is True
    pod = documents.pod_spec(doc)
    pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ].append({"matchExpressions": [expr(PRODUCT, "In", "NVIDIA-L4")]})
    message = answer(verifier, doc)["status"]["message"]
    assert "required node affinity term 2 admits NVIDIA-L4" in message


def test_images_outside_the_policy_pass_untouched(verifier: FakeVerifier) -> None:
    for image in ("nginx", "registry.example.com/other/x:1", "docker.io/library/python:3.11"):
        doc = documents.schedule(documents.load("pod-create", image))
        response = answer(verifier, doc)
        assert response == {"uid": doc["request"]["uid"], "allowed": True}
    assert verifier.calls == []


def test_unlisted_registries_deny_closes_names_no_check_can_see_through(verifier: FakeVerifier) -> None:
    """``vm:5101`` may be an /etc/hosts alias of the governed registry: no name check can tell.
    With ``unlisted_registries: deny`` only the registries the policy names are pulled from."""
    policy = {"unlisted_registries": "deny", "unverified_registries": ["docker.io"]}
    doc = documents.load("pod-create", "vm:5101/kernelbake/qwen3-0.6b:h100")
    assert answer(verifier, doc)["allowed"] is True
    response = answer(verifier, doc, **policy)
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert response["status"]["message"] == (
        "kernelbake admission: container \"vllm\": image 'vm:5101/kernelbake/qwen3-0.6b:h100' is from the "
        "registry vm:5101, which the policy does not list (unlisted_registries: deny); govern it under "
        "images, or list it in unverified_registries"
    )
    # Governed images are verified as before; Docker Hub is listed; the governed host's other
    # repositories pass untouched.
    doc = documents.load("deployment-create", TAG)
    documents.set_images(doc, "registry.example.com/tools/preflight:1", only="preflight")
    documents.add_image_volume(doc, "ghcr.io/acme/cache:1")
    response = answer(verifier, doc, **policy)
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "kernelbake admission: image volume \"kernel-cache\": image 'ghcr.io/acme/cache:1' is from the "
        "registry ghcr.io, which the policy does not list (unlisted_registries: deny); govern it under "
        "images, or list it in unverified_registries"
    )
    documents.pod_spec(doc)["volumes"] = []
    response = answer(verifier, doc, **policy)
    assert response["allowed"] is True, response
    assert [op["path"] for op in json.loads(base64.b64decode(response["patch"]))] == [
        "/spec/template/spec/containers/0/image"
    ]
    warned = answer(verifier, documents.load("pod-create", "vm:5101/x:1"), mode="warn", **policy)
    assert warned["allowed"] is True
    assert warned["warnings"][0].startswith(
        "kernelbake (warn mode) would deny: container \"vllm\": image 'vm:5101/x:1'"
    )


def test_a_reference_that_cannot_be_read_is_denied_wherever_it_points(verifier: FakeVerifier) -> None:
    # The runtime might read it differently from us: it could name a governed repository.
    response = answer(verifier, documents.schedule(documents.load("pod-create", "Not A Ref")))
    assert response["allowed"] is False
    assert "admits only references it can read" in response["status"]["message"]
    assert verifier.calls == []


def test_another_spelling_of_the_governed_host_is_verified_and_keeps_its_spelling(
    verifier: FakeVerifier,
) -> None:
    host, _, rest = REPO.partition("/")
    spelled = f"{host.upper()}./{rest}:h100"
    doc = documents.load("pod-create", spelled)
    response = answer(verifier, doc)
    assert response["allowed"] is True, response
    assert verifier.calls == [TAG]
    assert documents.apply_patch(doc, response)["spec"]["containers"][0]["image"] == (
        f"{host.upper()}./{rest}@{DIGEST}"
    )


def test_a_governed_image_without_tag_or_digest_is_denied(verifier: FakeVerifier) -> None:
    response = answer(verifier, documents.load("pod-create", REPO))
    assert response["allowed"] is False
    assert f"image {REPO} has no tag or digest" in response["status"]["message"]
    assert verifier.calls == []


def test_a_broken_reference_into_a_governed_repository_is_denied(verifier: FakeVerifier) -> None:
    response = answer(verifier, documents.load("pod-create", f"{REPO}:bad tag"))
    assert response["allowed"] is False
    assert "bad tag 'bad tag'" in response["status"]["message"]


def test_digest_wins_over_tag_and_is_what_is_verified(verifier: FakeVerifier) -> None:
    image = f"{REPO}:a100@{DIGEST}"
    doc = documents.load("pod-create", image)
    response = answer(verifier, doc)
    assert response["allowed"] is True
    assert documents.apply_patch(doc, response)["spec"]["containers"][0]["image"] == f"{REPO}@{DIGEST}"
    assert verifier.calls == [f"{REPO}@{DIGEST}"]
    assert any("the digest wins" in w for w in response["warnings"])


def test_already_pinned_image_needs_no_patch(verifier: FakeVerifier) -> None:
    response = answer(verifier, documents.load("pod-create", f"{REPO}@{DIGEST}"))
    assert response == {"uid": "5f4c7b0e-2a7d-4c0f-9d55-1f7a3c9e8b21", "allowed": True}


def test_validating_endpoint_never_patches(verifier: FakeVerifier) -> None:
    response = answer(verifier, documents.load("pod-create", TAG), Endpoint.VALIDATE)
    assert response == {"uid": "5f4c7b0e-2a7d-4c0f-9d55-1f7a3c9e8b21", "allowed": True}


def test_update_checks_the_new_object(verifier: FakeVerifier) -> None:
    doc = documents.as_update(documents.load("deployment-create", f"{REPO}:a100"), old_image=TAG)
    response = answer(verifier, doc)
    assert response["allowed"] is False
    assert "arch: baked 'sm_80', found 'sm_90a'" in response["status"]["message"]
    doc = documents.as_update(documents.load("pod-create", TAG), old_image=f"{REPO}:a100")
    response = answer(verifier, doc)
    assert response["allowed"] is True and documents.apply_patch(doc, response)["spec"]["containers"][0][
        "image"
    ].endswith(DIGEST)


def test_registry_down_denies_by_default_and_unsafe_allow_admits_unpinned(verifier: FakeVerifier) -> None:
    verifier.down = True
    doc = documents.load("pod-create", TAG)
    response = answer(verifier, doc)
    assert response["allowed"] is False
    assert response["status"]["code"] == 503
    assert (
        "could not be verified: registry registry.example.com did not answer" in response["status"]["message"]
    )
    response = answer(verifier, doc, registry_errors="unsafe-allow")
    assert response["allowed"] is True and "patch" not in response
    assert "UNVERIFIED" in response["warnings"][0]


def test_warn_mode_admits_with_warnings_and_still_pins_what_verified(verifier: FakeVerifier) -> None:
    doc = documents.load("deployment-create", TAG)
    documents.set_images(doc, f"{REPO}:unsigned", only="preflight")
    response = answer(verifier, doc, mode="warn")
    assert response["allowed"] is True
    assert response["warnings"][0].startswith('kernelbake (warn mode) would deny: init container "preflight"')
    ops = json.loads(base64.b64decode(response["patch"]))
    assert [op["path"] for op in ops] == ["/spec/template/spec/containers/0/image"]


@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
def test_delete_and_connect_are_allowed(verifier: FakeVerifier, operation: str) -> None:
    doc = documents.load("pod-create", f"{REPO}:unsigned")
    doc["request"]["operation"] = operation
    doc["request"]["oldObject"], doc["request"]["object"] = doc["request"]["object"], None
    assert answer(verifier, doc)["allowed"] is True


def test_objects_being_deleted_and_status_updates_are_allowed(verifier: FakeVerifier) -> None:
    doc = documents.as_update(documents.load("pod-create", f"{REPO}:unsigned"), old_image=f"{REPO}:unsigned")
    doc["request"]["object"]["metadata"]["deletionTimestamp"] = "2025-11-03T10:00:00Z"
    # A finalizer removed, a grace period shortened: nothing that runs is new.
    doc["request"]["object"]["metadata"]["finalizers"] = []
    doc["request"]["object"]["spec"]["terminationGracePeriodSeconds"] = 0
    assert answer(verifier, doc) == {"uid": doc["request"]["uid"], "allowed": True}
    doc["request"]["object"]["metadata"].pop("deletionTimestamp")
    doc["request"]["subResource"] = "status"
    assert answer(verifier, doc)["allowed"] is True
    assert verifier.calls == []


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_a_create_carrying_a_deletion_timestamp_is_reviewed(
    verifier: FakeVerifier, endpoint: Endpoint
) -> None:
    """The API server clears a new object's deletionTimestamp only after mutating admission:
    skipping review for it admitted any image unverified and unpinned."""
    doc = documents.load("pod-create", f"{REPO}:unsigned")
    doc["request"]["object"]["metadata"]["deletionTimestamp"] = "2025-11-03T10:00:00Z"
    response = answer(verifier, doc, endpoint)
    assert response["allowed"] is False
    assert "has no signature from a trusted identity" in response["status"]["message"]
    doc = documents.load("deployment-create", TAG)
    doc["request"]["object"]["metadata"]["deletionTimestamp"] = "2025-11-03T10:00:00Z"
    response = answer(verifier, doc, endpoint)
    assert response["allowed"] is True
    if endpoint is Endpoint.MUTATE:
        spec = documents.apply_patch(doc, response)["spec"]["template"]["spec"]
        assert spec["containers"][0]["image"] == f"{REPO}@{DIGEST}"


def test_an_update_of_an_object_being_deleted_that_brings_a_new_image_is_reviewed(
    verifier: FakeVerifier,
) -> None:
    doc = documents.as_update(documents.load("deployment-create", f"{REPO}:unsigned"), old_image=TAG)
    for which in ("object", "oldObject"):
        doc["request"][which]["metadata"]["deletionTimestamp"] = "2025-11-03T10:00:00Z"
    response = answer(verifier, doc)
    assert response["allowed"] is False
    assert f"image {REPO}:unsigned was rejected" in response["status"]["message"]
    # A new image volume is a new image too.
    doc = documents.as_update(documents.load("deployment-create", TAG), old_image=TAG)
    for which in ("object", "oldObject"):
        doc["request"][which]["metadata"]["deletionTimestamp"] = "2025-11-03T10:00:00Z"
    documents.add_image_volume(doc, f"{REPO}:unsigned")
    response = answer(verifier, doc)
    assert response["allowed"] is False
    assert f'image volume "kernel-cache": image {REPO}:unsigned was rejected' in response["status"]["message"]


def test_unknown_kinds_are_denied_in_enforce_mode_and_warned_in_warn_mode(verifier: FakeVerifier) -> None:
    doc = documents.load("pod-create", TAG)
    doc["request"]["kind"] = {"group": "argoproj.io", "version": "v1alpha1", "kind": "Rollout"}
    response = answer(verifier, doc)
    assert response["allowed"] is False and response["status"]["code"] == 400
    assert "does not review argoproj.io/Rollout objects" in response["status"]["message"]
    response = answer(verifier, doc, mode="warn")
    assert response["allowed"] is True and "argoproj.io/Rollout" in response["warnings"][0]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda spec: spec.__setitem__("containers", {"name": "x"}), "spec.containers must be a list"),
        (lambda spec: spec["containers"].append("vllm"), "spec.containers[1] must be an object"),
        (lambda spec: spec["containers"][0].__setitem__("image", ["x"]), '("vllm").image must be a string'),
        (
            lambda spec: spec.__setitem__("nodeSelector", "gpu"),
            "nodeSelector must map label names to strings",
        ),
    ],
)
def test_malformed_objects_are_denied_with_code_400(
    verifier: FakeVerifier, mutate: Any, expected: str
) -> None:
    doc = documents.load("pod-create", TAG)
    mutate(doc["request"]["object"]["spec"])
    for mode in ("enforce", "warn"):
        response = answer(verifier, doc, mode=mode)
        assert response["allowed"] is False and response["status"]["code"] == 400
        assert expected in response["status"]["message"]


def test_a_deployment_without_a_template_is_malformed(verifier: FakeVerifier) -> None:
    doc = documents.load("deployment-create", TAG)
    del doc["request"]["object"]["spec"]["template"]
    response = answer(verifier, doc)
    assert response["status"]["code"] == 400
    assert "Deployment has no object at spec.template" in response["status"]["message"]


def test_several_problems_are_all_reported(verifier: FakeVerifier, keys: dict[str, CacheKey]) -> None:
    doc = documents.load("deployment-create", TAG)
    documents.set_images(doc, f"{REPO}:unsigned", only="preflight")
    documents.set_images(doc, f"{REPO}:a100", only="vllm")
    message = answer(verifier, doc)["status"]["message"]
    assert 'init container "preflight"' in message and 'container "vllm"' in message
    assert message.count("; ") >= 1


def test_an_update_that_changes_nothing_that_runs_is_allowed_without_checks(verifier: FakeVerifier) -> None:
    doc = documents.as_update(
        documents.load("deployment-create", f"{REPO}:unsigned"), old_image=f"{REPO}:unsigned"
    )
    doc["request"]["object"]["spec"]["replicas"] = 5
    doc["request"]["object"]["metadata"]["labels"]["team"] = "serving"
    assert answer(verifier, doc) == {"uid": doc["request"]["uid"], "allowed": True}
    assert verifier.calls == []


def test_an_unchanged_image_in_a_changed_pod_is_checked_but_not_rewritten(verifier: FakeVerifier) -> None:
    doc = documents.as_update(documents.load("pod-create", TAG), old_image=TAG)
    doc["request"]["object"]["spec"]["activeDeadlineSeconds"] = 3600
    response = answer(verifier, doc)
    # Rewriting the image of a running pod would restart its container.
    assert response == {"uid": doc["request"]["uid"], "allowed": True}
    assert verifier.calls == [TAG]
    verifier.wrong_signer.add(TAG)
    doc = documents.as_update(doc, old_image=TAG)
    doc["request"]["object"]["spec"]["activeDeadlineSeconds"] = 60
    assert answer(verifier, doc)["allowed"] is False
