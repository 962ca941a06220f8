"""Where the pod spec lives in each kind of object, and which containers it runs.

Paths are kept as tuples of JSON-pointer segments so that patches address the object the API
server sent (``/spec/template/spec/containers/0/image`` for a Deployment,
``/spec/jobTemplate/spec/template/spec/...`` for a CronJob).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

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


class ImageSite(Protocol):
    """A place in a pod spec that names an image the kubelet pulls: a container's ``image``
    (``Container``) or an image volume's ``reference`` (``volumes.ImageVolume``)."""

    @property
    def image(self) -> str: ...

    # JSON pointer segments of the field, for the patch and for comparing with the old object.
    @property
    def path(self) -> tuple[str, ...]: ...

    @property
    def pointer(self) -> str: ...

    @property
    def where(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class Container:
    field: str
    index: int
    name: str
    image: str
    # JSON pointer segments of the image field.
    path: tuple[str, ...]

    @property
    def pointer(self) -> str:
        return pointer(self.path)

    @property
    def where(self) -> str:
        kind = {"initContainers": "init container", "ephemeralContainers": "ephemeral container"}
        return f'{kind.get(self.field, "container")} "{self.name}"'


def pointer(path: Sequence[str]) -> str:
    """RFC 6901: ``~`` → ``~0``, ``/`` → ``~1``."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


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


def containers(spec_path: tuple[str, ...], spec: Mapping[str, Any]) -> Iterator[Container]:
    for field in CONTAINER_FIELDS:
        items = spec.get(field)
        if items is None:
            continue
        if not isinstance(items, list):
            raise MalformedObject(f"{'.'.join(spec_path)}.{field} must be a list")
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                raise MalformedObject(f"{'.'.join(spec_path)}.{field}[{index}] must be an object")
            image = item.get("image")
            name = item.get("name")
            label = name if isinstance(name, str) and name else f"{field}[{index}]"
            if image is None or image == "":
                # Defaulted or rejected by the API server's own validation; nothing to run yet.
                continue
            if not isinstance(image, str):
                raise MalformedObject(f'{field}[{index}] ("{label}").image must be a string')
            yield Container(field, index, label, image, (*spec_path, field, str(index), "image"))


def template_metadata(obj: Mapping[str, Any], spec_path: tuple[str, ...]) -> Any:
    """The metadata beside the pod spec at ``spec_path``: the Pod's own, or its template's."""
    node: Any = obj
    for segment in spec_path[:-1]:
        node = node.get(segment) if isinstance(node, dict) else None
    return node.get("metadata") if isinstance(node, dict) else None
