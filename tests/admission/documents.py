"""AdmissionReview documents as the API server sends them, from the templates in requests/.

The templates are full documents (defaults filled in, managedFields, options …); helpers set
the image, the scheduling constraints and turn a CREATE into the UPDATE the API server sends
for a change to an existing object (oldObject with uid, resourceVersion and status).
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from pathlib import Path
from typing import Any

import jsonpatch

REQUESTS = Path(__file__).parent / "requests"
H100 = "NVIDIA-H100-80GB-HBM3"

_SPEC_PATHS = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    "PodTemplate": ("template", "spec"),
}


def review_of(
    obj: dict[str, Any], *, kind: str = "Deployment", group: str = "apps", uid: str = "u-1"
) -> dict[str, Any]:
    """A CREATE of ``obj`` in ``default``, as the API server sends it, without a template's
    defaults (for the shapes a test or bench builds itself)."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": {"group": group, "version": "v1", "resource": kind.lower() + "s"},
            "namespace": "default",
            "operation": "CREATE",
            "object": obj,
        },
    }


def load(name: str, image: str, *, uid: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((REQUESTS / f"{name}.json").read_text())
    if uid is not None:
        doc["request"]["uid"] = uid
    set_images(doc, image)
    return doc


def pod_spec(doc: dict[str, Any], which: str = "object") -> dict[str, Any]:
    obj = doc["request"][which]
    node = obj
    for segment in _SPEC_PATHS.get(obj["kind"], _SPEC_PATHS["Deployment"]):
        node = node[segment]
    return node  # type: ignore[no-any-return]


def set_images(doc: dict[str, Any], image: str, *, only: str | None = None) -> dict[str, Any]:
    """Replace every image that is the placeholder IMAGE (or the container named ``only``)."""
    spec = pod_spec(doc)
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(field, []):
            if (only is None and c["image"] in ("IMAGE", image)) or c["name"] == only:
                c["image"] = image
    return doc


def add_image_volume(
    doc: dict[str, Any],
    reference: str,
    *,
    name: str = "kernel-cache",
    pull_policy: str = "IfNotPresent",
    which: str = "object",
) -> dict[str, Any]:
    """Mount the image ``reference`` (a Kubernetes image volume) over the kernelbake cache root
    of the first container, as the attack of issue 20 did."""
    spec = pod_spec(doc, which)
    spec.setdefault("volumes", []).append(
        {"name": name, "image": {"reference": reference, "pullPolicy": pull_policy}}
    )
    spec["containers"][0].setdefault("volumeMounts", []).append(
        {"name": name, "mountPath": "/opt/kernelbake/cache", "readOnly": True}
    )
    return doc


def schedule(
    doc: dict[str, Any], *, node_selector: dict[str, str] | None = None, terms: list[Any] | None = None
) -> dict[str, Any]:
    """Set the pod's nodeSelector and required node affinity terms (None removes them)."""
    spec = pod_spec(doc)
    spec.pop("nodeSelector", None)
    spec.pop("affinity", None)
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    if terms is not None:
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    return doc


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


def as_update(doc: dict[str, Any], *, old_image: str) -> dict[str, Any]:
    """The UPDATE the API server sends when the object already exists with ``old_image``."""
    doc = copy.deepcopy(doc)
    request = doc["request"]
    request["uid"] = str(uuid.uuid4())
    request["operation"] = "UPDATE"
    obj = request["object"]
    meta = obj["metadata"]
    meta.update(
        {
            "uid": "3e1f0c9a-77b2-4d51-8a0e-5c6d2b9f4e18",
            "resourceVersion": "48213",
            "generation": 2,
            "creationTimestamp": "2025-11-03T09:12:44Z",
        }
    )
    old = copy.deepcopy(obj)
    old["metadata"]["resourceVersion"] = "48190"
    old["metadata"]["generation"] = 1
    request["oldObject"] = old
    spec = pod_spec(doc, "oldObject")
    for field in ("initContainers", "containers"):
        for c in spec.get(field, []):
            if c["image"] == pod_spec(doc)["containers"][0]["image"]:
                c["image"] = old_image
    if obj["kind"] == "Pod":
        status = {"phase": "Running", "hostIP": "10.0.3.17", "podIP": "10.244.2.31", "qosClass": "BestEffort"}
        obj["status"] = status
        old["status"] = status
        obj["spec"]["nodeName"] = old["spec"]["nodeName"] = "gpu-h100-a"
    request["options"] = {
        "kind": "UpdateOptions",
        "apiVersion": "meta.k8s.io/v1",
        "fieldManager": "kubectl-set",
    }
    return doc


def apply_patch(doc: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """The request's object after the response's patch, applied by an independent RFC 6902
    implementation (``jsonpatch``): proves the patch is valid, not just well-meant."""
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    out: dict[str, Any] = jsonpatch.JsonPatch(ops).apply(copy.deepcopy(doc["request"]["object"]))
    return out
