"""The one walk of a pod spec: every container (init, regular, ephemeral, in that order) with its
mounts and variables, and the image volumes; each rule reads the pod from here.

The walk is as strict as the review must be and no stricter: a container field that is no list,
an entry that is no object or an image that is no string makes the object malformed
(``MalformedObject``, answered with code 400); a mount or variable that is no object is junk
the API server refuses after admission, and names nothing here (a rule judges what is left).
``require_readable`` is the stricter reading for the containers of governed images, whose
mounts and variables decide what ``serve`` trusts.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Mapping
from typing import Any

from kernelbake.admission.frozen import fast_init
from kernelbake.admission.workloads import CONTAINER_FIELDS, MalformedObject, pointer

_KINDS = {"initContainers": "init container", "ephemeralContainers": "ephemeral container"}


def normal(path: str) -> str:
    """``path`` as the container's root resolves it lexically: relative paths under ``/``,
    ``//`` and ``..`` collapsed, no trailing ``/``."""
    if path[:1] == "/" and path[-1:] != "/" and "//" not in path and "/." not in path:
        # Already so (absolute, no empty, "." or ".." component, no trailing "/"; "/." also
        # sends names that start with a dot the long way): most mounts are written this way.
        return path
    return "/" + posixpath.normpath("/" + path).lstrip("/")


def under(path: Any, root: str) -> bool:
    """Whether ``path`` (as written in the pod spec) is ``root`` or inside it, resolved."""
    if not isinstance(path, str):
        return False
    # Resolving only drops components ("", ".", and ".." with the one before it), never makes
    # one: a path in which the root's last component does not occur cannot resolve at or under
    # the root. Most mounts are elsewhere, and each rule asks of each mount; this spares them
    # the normalisation (tests/admission/test_pod.py checks the two agree).
    if root.rpartition("/")[2] not in path:
        return False
    resolved = normal(path)
    return resolved == root or resolved.startswith(root + "/")


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Mount:
    """One entry of a container's ``volumeMounts``."""

    # None where the pod spec has no string: such a mount names no volume, verified or not.
    name: str | None
    # mountPath as written (any JSON value).
    path: Any
    # subPath or subPathExpr: the container sees part of the volume.
    partial: bool

    def under(self, root: str) -> bool:
        return under(self.path, root)


# Slots: a pod spec may hold some 150,000 containers (an 8 MiB body), each walked into one.
@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Container:
    """A container of the pod; an image site when it names an image."""

    field: str
    index: int
    # Its name, or ``field[index]`` where it has none.
    name: str
    # "" where the pod spec leaves it to the API server's defaults.
    image: str
    # JSON pointer segments of the image field.
    path: tuple[str, ...]
    obj: Mapping[str, Any] = dataclasses.field(compare=False, repr=False)

    # Its volumeMounts, and the entries of its env that are objects.
    mounts: tuple[Mount, ...] = dataclasses.field(default=(), compare=False, repr=False)
    env: tuple[Mapping[str, Any], ...] = dataclasses.field(default=(), compare=False, repr=False)

    @property
    def pointer(self) -> str:
        return pointer(self.path)

    @property
    def where(self) -> str:
        return f'{_KINDS.get(self.field, "container")} "{self.name}"'

    @property
    def at(self) -> tuple[str, ...]:
        """JSON pointer segments of the container itself (for patches of its fields)."""
        return self.path[:-1]

    def named(self, variable: str) -> list[Mapping[str, Any]]:
        """Every entry of ``env`` that sets ``variable`` (Kubernetes gives the container the last)."""
        if not self.env:
            return []
        return [e for e in self.env if e.get("name") == variable]


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class ImageVolume:
    """``spec.volumes[].image.reference`` (Kubernetes image volumes, GA in 1.36): the kubelet
    pulls it like a container image, so admission reviews it like one."""

    index: int
    name: str
    # The reference as written (``volumes[N].image.reference``).
    image: str
    # JSON pointer segments of the reference field.
    path: tuple[str, ...]

    @property
    def pointer(self) -> str:
        return pointer(self.path)

    @property
    def where(self) -> str:
        return f'image volume "{self.name}"'


@fast_init
@dataclasses.dataclass(frozen=True)
class Pod:
    spec_path: tuple[str, ...]
    spec: Mapping[str, Any] = dataclasses.field(compare=False, repr=False)
    containers: tuple[Container, ...] = ()
    image_volumes: tuple[ImageVolume, ...] = ()
    # Names of the pod's hostPath volumes.
    host_paths: tuple[str, ...] = ()

    def sites(self) -> list[Container | ImageVolume]:
        """Every image the pod pulls: its containers' and its image volumes'."""
        found: list[Container | ImageVolume] = []
        for c in self.containers:
            if c.image:
                found.append(c)
        found += self.image_volumes
        return found

    def of(self, *fields: str) -> list[Container]:
        found: list[Container] = []
        for c in self.containers:
            if c.field in fields:
                found.append(c)
        return found


def walk(spec_path: tuple[str, ...], spec: Mapping[str, Any]) -> Pod:
    """The pod spec at ``spec_path``; raises ``MalformedObject`` for a shape no review can read."""
    containers = tuple(_containers(spec_path, spec))
    volumes, host_paths = _volumes(spec_path, spec)
    return Pod(spec_path, spec, containers, volumes, host_paths)


def _containers(spec_path: tuple[str, ...], spec: Mapping[str, Any]) -> list[Container]:
    found: list[Container] = []
    for field in CONTAINER_FIELDS:
        items = spec.get(field)
        if items is None:
            continue
        if not isinstance(items, list):
            raise MalformedObject(f"{'.'.join(spec_path)}.{field} must be a list")
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                raise MalformedObject(f"{'.'.join(spec_path)}.{field}[{index}] must be an object")
            found.append(_container(spec_path, field, index, item))
    return found


def _container(spec_path: tuple[str, ...], field: str, index: int, item: Mapping[str, Any]) -> Container:
    image, name = item.get("image"), item.get("name")
    label = name if isinstance(name, str) and name else f"{field}[{index}]"
    if image is not None and not isinstance(image, str):
        raise MalformedObject(f'{field}[{index}] ("{label}").image must be a string')
    mounts, env = item.get("volumeMounts"), item.get("env")
    # Loops, not comprehensions: each comprehension is a call, and most containers have a
    # mount or two and few variables.
    walked: list[Mount] = []
    if isinstance(mounts, list):
        for m in mounts:
            if isinstance(m, dict):
                name = m.get("name")
                walked.append(
                    Mount(
                        name if isinstance(name, str) else None,
                        m.get("mountPath"),
                        bool(m.get("subPath") or m.get("subPathExpr")),
                    )
                )
    variables: list[Mapping[str, Any]] = []
    if isinstance(env, list):
        for e in env:
            if isinstance(e, dict):
                variables.append(e)
    return Container(
        field,
        index,
        label,
        image or "",
        (*spec_path, field, str(index), "image"),
        item,
        tuple(walked),
        tuple(variables),
    )


def _volumes(
    spec_path: tuple[str, ...], spec: Mapping[str, Any]
) -> tuple[tuple[ImageVolume, ...], tuple[str, ...]]:
    items = spec.get("volumes")
    if items is None:
        return (), ()
    where = ".".join(spec_path)
    if not isinstance(items, list):
        raise MalformedObject(f"{where}.volumes must be a list")
    found: list[ImageVolume] = []
    host_paths: list[str] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise MalformedObject(f"{where}.volumes[{index}] must be an object")
        if item.get("hostPath") is not None:
            host_paths.append(str(item.get("name"))[:80])
        source = item.get("image")
        if source is None:
            continue
        name = item.get("name")
        label = name if isinstance(name, str) and name else f"volumes[{index}]"
        if not isinstance(source, dict):
            raise MalformedObject(f'volumes[{index}] ("{label}").image must be an object')
        reference = source.get("reference")
        if reference is None or reference == "":
            # Optional in templates, for config management to fill in (the API server rejects
            # a Pod without one): nothing is pulled yet.
            continue
        if not isinstance(reference, str):
            raise MalformedObject(f'volumes[{index}] ("{label}").image.reference must be a string')
        found.append(
            ImageVolume(index, label, reference, (*spec_path, "volumes", str(index), "image", "reference"))
        )
    return tuple(found), tuple(host_paths)
