"""Where the pod spec lives in each kind of object (the walk of the spec itself is ``pod``).

Paths are kept as tuples of JSON-pointer segments so that patches address the object the API
server sent (``/spec/template/spec/containers/0/image`` for a Deployment,
``/spec/jobTemplate/spec/template/spec/...`` for a CronJob).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kernelbake.admission.review import GroupKind
from kernelbake.errors import BadInput

_TEMPLATE = ("spec", "template", "spec")
POD_SPEC_PATHS: Mapping[GroupKind, tuple[str, ...]] = {
    GroupKind("", "Pod"): ("spec",),
    GroupKind("", "ReplicationController"): _TEMPLATE,
    GroupKind("", "PodTemplate"): ("template", "spec"),
    GroupKind("apps", "Deployment"): _TEMPLATE,
    GroupKind("apps", "StatefulSet"): _TEMPLATE,
    GroupKind("apps", "DaemonSet"): _TEMPLATE,
    GroupKind("apps", "ReplicaSet"): _TEMPLATE,
    GroupKind("batch", "Job"): _TEMPLATE,
    GroupKind("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template", "spec"),
}
CONTAINER_FIELDS = ("initContainers", "containers", "ephemeralContainers")


class MalformedObject(BadInput):
    """The object does not have the shape of its kind (answered with code 400)."""


def pointer(path: Sequence[str]) -> str:
    """RFC 6901: ``~`` → ``~0``, ``/`` → ``~1``."""
    joined = "/".join(path)
    if "~" not in joined and joined.count("/") == len(path) - 1:
        # No segment has a "~" or a "/" (the joins are the only slashes): nothing to escape.
        return "/" + joined if path else ""
    return "".join(["/" + p.replace("~", "~0").replace("/", "~1") for p in path])


def known_kinds() -> str:
    return ", ".join(sorted({gk.kind for gk in POD_SPEC_PATHS}))


def pod_spec(kind: GroupKind, obj: Mapping[str, Any]) -> tuple[tuple[str, ...], Mapping[str, Any]] | None:
    """``(path, spec)`` of the pod spec in ``obj``, or None when ``kind`` has none we know."""
    path = POD_SPEC_PATHS.get(kind)
    if path is None:
        return None
    node: Any = obj
    for i, segment in enumerate(path):
        node = node.get(segment) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            where = ".".join(path[: i + 1])
            raise MalformedObject(f"{kind.kind} has no object at {where}")
    return path, node


def template_metadata(obj: Mapping[str, Any], spec_path: tuple[str, ...]) -> Any:
    """The metadata beside the pod spec at ``spec_path``: the Pod's own, or its template's."""
    node: Any = obj
    for segment in spec_path[:-1]:
        node = node.get(segment) if isinstance(node, dict) else None
    return node.get("metadata") if isinstance(node, dict) else None
