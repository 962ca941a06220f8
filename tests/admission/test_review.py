from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kernelbake.admission.review import Code, MalformedReview, Operation, Response, parse_review
from tests.admission import documents


def test_a_real_request_parses() -> None:
    doc = documents.load("deployment-create", "registry.example.com/kernelbake/q:t")
    request = parse_review(doc)
    assert request.uid == "0b9e1d7c-8f3a-4e52-a6c1-3d2f9b7e4a10"
    assert (request.kind.group, request.kind.kind) == ("apps", "Deployment")
    assert request.operation is Operation.CREATE
    assert request.namespace == "inference" and request.old_object is None and not request.dry_run
    assert request.user == "system:serviceaccount:argocd:argocd-application-controller"
    assert parse_review(documents.load("cronjob-create", "x")).dry_run


def _doc(**request: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE",
        "object": {"spec": {}},
    }
    base.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": base}


@pytest.mark.parametrize(
    ("doc", "message", "uid"),
    [
        ([], "an AdmissionReview is a JSON object, got an array", ""),
        ("x", "got a string", ""),
        (
            {"apiVersion": "v1", "kind": "AdmissionReview", "request": {"uid": "u-1"}},
            "apiVersion 'v1' is not",
            "u-1",
        ),
        (
            {"apiVersion": "admission.k8s.io/v1", "kind": "Review", "request": {"uid": "u-1"}},
            "kind 'Review'",
            "u-1",
        ),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "no request object", ""),
        (_doc(uid=None), "request.uid is missing", ""),
        (_doc(uid=7), "request.uid is missing", ""),
        (_doc(kind="Pod"), "request.kind must be an object", "u-1"),
        (_doc(kind={"group": 1, "kind": "Pod"}), "request.kind.group must be a string", "u-1"),
        (_doc(operation="PATCH"), "request.operation 'PATCH' is not one of", "u-1"),
        (_doc(object=None), "request.object is missing for a CREATE", "u-1"),
        (_doc(object=[1]), "request.object must be an object, got an array", "u-1"),
        (_doc(oldObject="x"), "request.oldObject must be an object", "u-1"),
    ],
)
def test_malformed_reviews_keep_what_can_be_echoed(doc: Any, message: str, uid: str) -> None:
    with pytest.raises(MalformedReview) as err:
        parse_review(doc)
    assert message in str(err.value)
    answer = Response.malformed(err.value).to_document()
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == uid
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 400
    assert answer["response"]["status"]["reason"] == "BadRequest"


def test_v1beta1_is_echoed() -> None:
    doc = _doc()
    doc["apiVersion"] = "admission.k8s.io/v1beta1"
    assert parse_review(doc).api_version == "admission.k8s.io/v1beta1"


def test_response_document_shape() -> None:
    patch = [{"op": "replace", "path": "/spec/containers/0/image", "value": "r/x@sha256:" + "0" * 64}]
    doc = Response(uid="u", allowed=True, patch=patch, warnings=("w" * 300,)).to_document()
    response = doc["response"]
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == patch
    assert len(response["warnings"][0]) == 256
    assert "status" not in response
    denied = Response(uid="u", allowed=False, code=Code.FORBIDDEN, message="no").to_document()["response"]
    assert denied["status"] == {"status": "Failure", "code": 403, "reason": "Forbidden", "message": "no"}
    assert "patch" not in denied
