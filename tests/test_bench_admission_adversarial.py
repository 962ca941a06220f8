"""bench/admission_adversarial.py's shapes, without a server: each body is an AdmissionReview of
the size it claims (the largest that fits, up to the server's MAX_BODY) and holds the items it
says it holds. No timing here: the bench measures that."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from kernelbake.admission.http.server import MAX_BODY
from tests.support import bench

ADV = bench.load("admission_adversarial")
REFS = ADV.Refs(
    image="127.0.0.1:5000/kernelbake/qwen3-0.6b@sha256:" + "1" * 64,
    artifact="127.0.0.1:5000/kernelbake/tiny-llama@sha256:" + "2" * 64,
    repository="127.0.0.1:5000/kernelbake/qwen3-0.6b",
)


def template(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = doc["request"]["object"]["spec"]["template"]
    return out


def terms(doc: dict[str, Any]) -> list[Any]:
    affinity = template(doc)["spec"]["affinity"]["nodeAffinity"]
    out: list[Any] = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return out


# How many of the shape's items a body holds, read back from the document.
COUNT: dict[str, Callable[[dict[str, Any]], int]] = {
    "cache_volumes_16_x_containers": lambda d: len(template(d)["spec"]["containers"]),
    "cache_volumes_300_x_containers": lambda d: len(template(d)["spec"]["containers"]),
    "placement_64_terms_x_64_expressions": lambda d: len(terms(d)[0]["matchExpressions"][0]["values"]) - 1,
    "product_list": lambda d: len(terms(d)[0]["matchExpressions"][0]["values"]) - 1,
    "node_selector": lambda d: len(template(d)["spec"]["nodeSelector"]) - 1,
    "containers": lambda d: len(template(d)["spec"]["containers"]) - 1,
    "containers_and_an_uncached_digest": lambda d: len(template(d)["spec"]["containers"]) - 2,
    "annotation_value": lambda d: len(template(d)["metadata"]["annotations"][ADV.ANNOTATION_CONTAINER]),
    "annotations": lambda d: len(template(d)["metadata"]["annotations"]),
}


def test_every_shape_is_counted() -> None:
    assert {s.name for s in ADV.SHAPES} == set(COUNT)


@pytest.mark.parametrize("shape", ADV.SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("target", [1024 * 1024, MAX_BODY], ids=["1MiB", "max-body"])
def test_a_body_is_the_largest_of_its_shape_that_fits(shape: Any, target: int) -> None:
    build = shape.builder(REFS, 7)
    n, body = ADV.largest(build, target)
    assert len(body) <= target
    # One item more would not fit: the body is as large as the size allows.
    assert len(ADV.encode(build(n + 1))) > target
    doc = json.loads(body)
    assert doc["kind"] == "AdmissionReview" and doc["request"]["operation"] == "CREATE"
    assert COUNT[shape.name](doc) == n
    if target == MAX_BODY:
        # Within one item of the largest body the server accepts (a placement value is 4096
        # copies of one, the widest step).
        assert len(body) > MAX_BODY - 64 * 1024


def test_the_shapes_at_the_largest_body() -> None:
    by_name = {s.name: s for s in ADV.SHAPES}
    n, body = ADV.largest(by_name["containers"].builder(REFS, 0), MAX_BODY)
    assert n >= 100_000
    n, body = ADV.largest(by_name["cache_volumes_16_x_containers"].builder(REFS, 0), MAX_BODY)
    spec = template(json.loads(body))["spec"]
    assert [v["image"]["reference"] for v in spec["volumes"] if "image" in v] == [REFS.artifact] * 16
    assert all(c["volumeMounts"][0]["mountPath"] == "/opt/kernelbake/cache" for c in spec["containers"])
    placement = terms(
        json.loads(ADV.largest(by_name["placement_64_terms_x_64_expressions"].builder(REFS, 0), MAX_BODY)[1])
    )
    assert len(placement) == 64 and all(len(t["matchExpressions"]) == 64 for t in placement)


def test_each_send_of_the_uncached_shape_names_another_digest() -> None:
    shape = next(s for s in ADV.SHAPES if s.name == "containers_and_an_uncached_digest")
    images = {template(shape.builder(REFS, send)(3))["spec"]["containers"][-1]["image"] for send in range(5)}
    assert len(images) == 5
    assert all(i.startswith(REFS.repository + "@sha256:") for i in images)


def test_over_max_body_is_one_byte_past_it() -> None:
    body = ADV.over_max_body(REFS)
    assert len(body) == MAX_BODY + 1
    assert json.loads(body)["kind"] == "AdmissionReview"
