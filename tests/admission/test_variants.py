"""A pod naming a model's GPU index runs the variant for the GPU it is pinned to (injected
verifier; tests/fleet/test_admit_index.py does it against the real registry)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from kernelbake.admission.admit import Endpoint
from kernelbake.admission.references import parse_reference
from kernelbake.admission.service import Admitter
from kernelbake.admission.subject import IndexAccepted
from kernelbake.contract.key import CacheKey
from kernelbake.gfd import FAMILY, PRODUCT
from kernelbake.oci import RegistryUnavailable
from tests.admission import documents
from tests.admission.documents import H100, expr
from tests.admission.fakes import REGISTRY, REPO, FakeVerifier, digest_of, make_admitter, make_policy

INDEX = f"{REPO}:vllm-gpus"
H200 = "NVIDIA-H200"


@pytest.fixture
def fleet(keys: dict[str, CacheKey]) -> tuple[FakeVerifier, dict[str, str]]:
    """An index of h100, h200 and a100 variants (each signed); their digests by GPU."""
    v = FakeVerifier()
    digests = {gpu: v.add(f"{REPO}:{gpu}", keys[gpu]) for gpu in ("h100", "h200", "a100-80gb")}
    digests["index"] = v.add_index(
        INDEX, {f"{REPO}:{gpu}": keys[gpu] for gpu in ("h100", "h200", "a100-80gb")}
    )
    return v, digests


def review(verifier: FakeVerifier, doc: Any, endpoint: Endpoint = Endpoint.MUTATE, **policy: Any) -> Any:
    admitter = make_admitter(verifier, make_policy(**policy) if policy else None)
    return admitter, admitter.review(doc, endpoint)["response"]


def pod(image: str = INDEX, **schedule: Any) -> dict[str, Any]:
    return documents.schedule(documents.load("pod-create", image), **schedule)


@pytest.mark.parametrize(("product", "gpu"), [(H100, "h100"), (H200, "h200"), (f"{H200}-SHARED", "h200")])
def test_a_pod_naming_the_index_is_pinned_to_its_gpus_variant(
    fleet: tuple[FakeVerifier, dict[str, str]], product: str, gpu: str
) -> None:
    verifier, digests = fleet
    doc = pod(node_selector={PRODUCT: product})
    _, response = review(verifier, doc)
    assert response["allowed"] is True, response
    assert documents.apply_patch(doc, response)["spec"]["containers"][0]["image"] == f"{REPO}@{digests[gpu]}"
    # The index (its signature), then the one variant the pod runs; no other variant.
    assert verifier.calls == [INDEX, f"{REPO}@{digests[gpu]}"]


def test_the_index_pinned_by_digest_and_a_second_review_come_from_the_cache(
    fleet: tuple[FakeVerifier, dict[str, str]],
) -> None:
    verifier, digests = fleet
    doc = pod(f"{REPO}@{digests['index']}", terms=[{"matchExpressions": [expr(PRODUCT, "In", H200)]}])
    admitter, response = review(verifier, doc)
    assert response["allowed"] is True, response
    assert (
        documents.apply_patch(doc, response)["spec"]["containers"][0]["image"] == f"{REPO}@{digests['h200']}"
    )
    again = admitter.review(doc, Endpoint.MUTATE)["response"]
    assert again["patch"] == response["patch"]
    assert verifier.calls == [f"{REPO}@{digests['index']}", f"{REPO}@{digests['h200']}"]


def test_a_placement_that_allows_gpus_needing_different_variants_is_denied_with_the_selector_to_add(
    fleet: tuple[FakeVerifier, dict[str, str]],
) -> None:
    verifier, digests = fleet
    doc = pod(terms=[{"matchExpressions": [expr(PRODUCT, "In", H100, H200)]}])
    _, response = review(verifier, doc)
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "its placement allows GPUs that need different variants" in message
    assert f"{H100} needs NVIDIA H100 80GB HBM3 ({digests['h100'][:19]}…)" in message
    assert f"add nodeSelector {PRODUCT}: {H100} or {PRODUCT}: {H200}" in message
    # Two affinity terms, one per GPU: the same.
    doc = pod(
        terms=[
            {"matchExpressions": [expr(PRODUCT, "In", H100)]},
            {"matchExpressions": [expr(PRODUCT, "In", H200)]},
        ]
    )
    _, response = review(verifier, doc)
    assert "need different variants" in response["status"]["message"]
    # No variant was verified: nothing was chosen.
    assert set(verifier.calls) == {INDEX}


def test_a_gpu_no_variant_fits_is_denied_with_the_reasons(fleet: tuple[FakeVerifier, dict[str, str]]) -> None:
    verifier, _ = fleet
    _, response = review(verifier, pod(node_selector={PRODUCT: "NVIDIA-L4"}))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert f"names the GPU index {REPO}@" in message
    assert "admits NVIDIA-L4, which no variant fits" in message
    assert "NVIDIA H100 80GB HBM3: no baked caches apply: arch: baked 'sm_90a', found 'sm_89'" in message
    assert f"add one nodeSelector of {PRODUCT}: {H100}, {PRODUCT}: {H200}" in message


def test_same_arch_fits_only_in_arch_mode_with_a_warning(keys: dict[str, CacheKey]) -> None:
    verifier = FakeVerifier()
    h100 = verifier.add(f"{REPO}:h100", keys["h100"])
    verifier.add_index(INDEX, {f"{REPO}:h100": keys["h100"]})
    doc = pod(node_selector={PRODUCT: H200})
    _, response = review(verifier, doc)
    assert response["allowed"] is False
    assert "which no variant fits in gpu.match: device mode" in response["status"]["message"]
    assert "same arch, other device" in response["status"]["message"]
    _, response = review(verifier, doc, gpu={"match": "arch"})
    assert response["allowed"] is True, response
    assert documents.apply_patch(doc, response)["spec"]["containers"][0]["image"] == f"{REPO}@{h100}"
    assert any("admits NVIDIA-H200: device: baked 'NVIDIA H100 80GB HBM3'" in w for w in response["warnings"])


def test_a_family_pin_or_no_pin_is_not_enough_in_device_mode(
    fleet: tuple[FakeVerifier, dict[str, str]],
) -> None:
    verifier, _ = fleet
    _, response = review(verifier, pod(node_selector={FAMILY: "hopper"}))
    assert response["allowed"] is False
    assert f"but not {PRODUCT}" in response["status"]["message"]
    _, response = review(verifier, pod(node_selector={"kubernetes.io/os": "linux"}))
    assert response["allowed"] is False
    assert "does not pin a GPU" in response["status"]["message"]


def test_an_index_that_lies_about_a_variants_key_is_denied(keys: dict[str, CacheKey]) -> None:
    verifier = FakeVerifier()
    verifier.add(f"{REPO}:h100", keys["h100"])
    # The H200 entry of this index is the H100 image.
    verifier.add_index(INDEX, {f"{REPO}:h100": keys["h200"]})
    _, response = review(verifier, pod(node_selector={PRODUCT: H200}))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert (
        f"the index claims key {keys['h200'].digest} for it, but it verifies as {keys['h100'].digest}"
        in message
    )


def test_an_unsigned_variant_is_denied(keys: dict[str, CacheKey]) -> None:
    verifier = FakeVerifier()
    verifier.add(f"{REPO}:h100", keys["h100"])
    verifier.add_index(INDEX, {f"{REPO}:h100": keys["h100"]})
    verifier.wrong_signer.add(f"{REPO}:h100")
    _, response = review(verifier, pod(node_selector={PRODUCT: H100}))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "(the NVIDIA H100 80GB HBM3 variant of its GPU index) was rejected" in message
    assert "mallory@example.com" in message


def test_the_validating_endpoint_admits_without_a_patch(fleet: tuple[FakeVerifier, dict[str, str]]) -> None:
    verifier, _ = fleet
    _, response = review(verifier, pod(node_selector={PRODUCT: H100}), Endpoint.VALIDATE)
    assert response["allowed"] is True and "patch" not in response


def test_the_async_path_verifies_the_index_then_the_variant(
    fleet: tuple[FakeVerifier, dict[str, str]],
) -> None:
    verifier, digests = fleet
    admitter = make_admitter(verifier)
    doc = pod(node_selector={PRODUCT: H100})
    pending = admitter.review_nowait(doc, Endpoint.MUTATE, started=time.monotonic())
    assert not isinstance(pending, dict)
    response = asyncio.run(pending)["response"]  # type: ignore[arg-type]
    assert (
        documents.apply_patch(doc, response)["spec"]["containers"][0]["image"] == f"{REPO}@{digests['h100']}"
    )
    # Warm: both verdicts cached, answered at once.
    warm = admitter.review_nowait(doc, Endpoint.MUTATE, started=time.monotonic())
    assert isinstance(warm, dict) and warm["response"]["patch"] == response["patch"]


class HoldsOne:
    """The fleet's verifier, except that one reference holds its lane until released."""

    def __init__(self, verifier: FakeVerifier, held: str) -> None:
        self.verifier, self.held = verifier, held
        self.release = threading.Event()

    def __call__(self, reference: str) -> object:
        if reference == self.held:
            self.release.wait(30)
            raise RegistryUnavailable(f"registry {REGISTRY} timed out")
        return self.verifier(reference)


BLOCKER = f"{REPO}@{digest_of('blocker')}"


def held_lane(fleet: tuple[FakeVerifier, dict[str, str]], **policy: Any) -> tuple[HoldsOne, Admitter, str]:
    """An admitter whose registry has one verification thread, held by another image, with
    the index's verdict cached: a review of a pod naming the index has to queue its variant."""
    verifier, digests = fleet
    held = HoldsOne(verifier, BLOCKER)
    admitter = make_admitter(
        held, make_policy(deadline_seconds=0.3, concurrency=2, registry_concurrency=1, **policy)
    )
    assert isinstance(admitter.gateway.submit(parse_reference(INDEX)).result(timeout=30), IndexAccepted)
    admitter.gateway.submit(parse_reference(BLOCKER))
    assert admitter.gateway.running(REGISTRY) == 1
    return held, admitter, f"{REPO}@{digests['h100']}"


def test_the_variants_verification_queues_in_its_registrys_lane_and_is_dropped_with_the_review(
    fleet: tuple[FakeVerifier, dict[str, str]],
) -> None:
    held, admitter, variant = held_lane(fleet)
    try:
        response = admitter.review(pod(node_selector={PRODUCT: H100}), Endpoint.MUTATE)["response"]
        assert response["allowed"] is False and response["status"]["code"] == 503, response
        # Nobody waits for the variant any more: out of the queue, never verified, not asked twice.
        assert admitter.gateway.queued(REGISTRY) == 0
    finally:
        held.release.set()
    assert variant not in fleet[0].calls


def test_the_async_path_drops_the_queued_variant_with_the_review(
    fleet: tuple[FakeVerifier, dict[str, str]],
) -> None:
    held, admitter, variant = held_lane(fleet)
    try:
        pending = admitter.review_nowait(
            pod(node_selector={PRODUCT: H100}), Endpoint.MUTATE, started=time.monotonic()
        )
        # The variant is queued behind the held verification before anything is awaited.
        assert not isinstance(pending, dict) and admitter.gateway.queued(REGISTRY) == 1
        response = asyncio.run(pending)["response"]
        assert response["allowed"] is False and response["status"]["code"] == 503, response
        assert admitter.gateway.queued(REGISTRY) == 0
    finally:
        held.release.set()
    assert variant not in fleet[0].calls


def test_a_saturated_lane_denies_the_variant_with_the_reason(
    fleet: tuple[FakeVerifier, dict[str, str]],
) -> None:
    held, admitter, _ = held_lane(fleet, registry_queue=0)
    try:
        response = admitter.review(pod(node_selector={PRODUCT: H100}), Endpoint.MUTATE)["response"]
    finally:
        held.release.set()
    assert response["allowed"] is False and response["status"]["code"] == 503
    assert f"registry {REGISTRY} is saturated (0 verifications queued)" in response["status"]["message"]


def test_a_variant_shared_by_two_reviews_stays_queued_until_both_give_up(
    fleet: tuple[FakeVerifier, dict[str, str]],
) -> None:
    held, admitter, variant = held_lane(fleet)
    doc = pod(node_selector={PRODUCT: H100})
    try:
        # The second review starts later, so it still waits for the variant when the first gives up.
        late = admitter.review_nowait(doc, Endpoint.MUTATE, started=time.monotonic() + 0.5)
        assert not isinstance(late, dict)
        assert admitter.review(doc, Endpoint.MUTATE)["response"]["status"]["code"] == 503
        assert admitter.gateway.queued(REGISTRY) == 1, "the later review still waits for it"
        held.release.set()
        # The lane frees up: the variant runs, verifies, and the later review admits the pod.
        response = asyncio.run(late)["response"]
    finally:
        held.release.set()
    assert response["allowed"] is True, response
    assert fleet[0].calls.count(variant) == 1
