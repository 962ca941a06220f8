"""Image volumes: ``spec.volumes[].image.reference`` (Kubernetes image volumes, GA in 1.36).

The kubelet pulls the reference like a container image and mounts its files into the pod, so
an image volume mounted over ``/opt/kernelbake/cache`` of a signed container decides which
kernels run, and its own cache manifest then passes ``serve``'s integrity check. Admission
therefore reviews each one like a container image (same patterns, same trust, pinned by
digest); only what a *verified* volume is then checked against lives here (``check``), so a
later rule for what an image volume may hold slots in without touching the review.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kernelbake.admission.scheduling import Way
from kernelbake.admission.workloads import MalformedObject, pointer
from kernelbake.contract.key import CacheKey

# Said once per verified volume: admission judges a container's image against the pod's
# GPUs, and does not (yet) judge what a volume holds against them.
UNJUDGED = "verified; whether its caches fit the pod's GPUs is not judged for image volumes"


@dataclasses.dataclass(frozen=True)
class ImageVolume:
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


def image_volumes(spec_path: tuple[str, ...], spec: Mapping[str, Any]) -> Iterator[ImageVolume]:
    """Every image volume of the pod spec at ``spec_path`` that names a reference."""
    items = spec.get("volumes")
    if items is None:
        return
    where = ".".join(spec_path)
    if not isinstance(items, list):
        raise MalformedObject(f"{where}.volumes must be a list")
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise MalformedObject(f"{where}.volumes[{index}] must be an object")
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
        yield ImageVolume(index, label, reference, (*spec_path, "volumes", str(index), "image", "reference"))


def check(key: CacheKey, ways: Sequence[Way]) -> tuple[list[str], list[str]]:
    """``(problems, notes)`` for a volume whose image verified with ``key``: where a check of
    what the volume holds against the pod (a cache-only artifact's key against its GPUs) goes.
    Today there is none, and the note says so."""
    return [], [UNJUDGED]
