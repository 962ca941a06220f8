"""Which of an image's labels the compatibility key vouches for.

The key is what signing attests and admission checks, so every ``dev.kernelbake.*`` label
kernelbake writes is derived from it: the key's own labels (``CacheKey.labels``) and the GPU
labels, from the key's device through the GPU catalogue (one entry per device name). ``plan``
writes exactly ``derived_labels(key)``; ``check_labels`` rebuilds the key from an image's labels
and derives the rest again, so an edit to any of them reads as inconsistent. Every other label
(``org.opencontainers.*``, ones a later build added, GPU labels of a device this catalogue does
not know) is covered by nothing: it is reported apart, as unattested.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from kernelbake.catalogue import Catalogue, Gpu, load_catalogue
from kernelbake.contract.key import LABEL_NS, CacheKey, key_from_labels

GPU_LABEL = f"{LABEL_NS}.gpu"
GPU_FAMILY_LABEL = f"{LABEL_NS}.gpu.family"
GPU_PRODUCTS_LABEL = f"{LABEL_NS}.gpu.products"


def gpu_of(key: CacheKey, catalogue: Catalogue | None = None) -> Gpu | None:
    """The catalogue GPU the key was baked for, or None when this catalogue does not know it."""
    return (catalogue or load_catalogue()).gpu_by_device_name(key.device)


def gpu_labels(gpu: Gpu) -> dict[str, str]:
    return {
        GPU_LABEL: gpu.name,
        GPU_FAMILY_LABEL: gpu.family,
        GPU_PRODUCTS_LABEL: json.dumps(list(gpu.gfd_product)),
    }


def derived_labels(key: CacheKey, catalogue: Catalogue | None = None) -> dict[str, str]:
    """Every ``dev.kernelbake.*`` label of an image with this key (the GPU ones when the
    catalogue knows the key's device)."""
    gpu = gpu_of(key, catalogue)
    return {**key.labels(), **(gpu_labels(gpu) if gpu is not None else {})}


@dataclasses.dataclass(frozen=True)
class CheckedLabels:
    key: CacheKey
    gpu: Gpu | None  # from the key's device, never from a label
    derived: Mapping[str, str]  # labels the key vouches for, and their values on the image
    unattested: Mapping[str, str]  # every other label: nothing checks them
    problems: tuple[str, ...]  # derived labels whose value on the image is not the key's

    @property
    def consistent(self) -> bool:
        return not self.problems


def check_labels(labels: Mapping[str, str], catalogue: Catalogue | None = None) -> CheckedLabels:
    """Split ``labels`` into what the key vouches for and the rest; raises ``InvalidKey`` when the
    key's own labels disagree, lists the derived labels that do not match in ``problems``."""
    key = key_from_labels(labels)
    gpu = gpu_of(key, catalogue)
    expected = derived_labels(key, catalogue)
    problems = tuple(
        f"label {name}={labels[name]!r}, but the key's device {key.device!r} gives {value!r}"
        for name, value in expected.items()
        if name in labels and labels[name] != value
    )
    return CheckedLabels(
        key=key,
        gpu=gpu,
        derived={n: labels[n] for n in expected if n in labels},
        unattested={n: v for n, v in sorted(labels.items()) if n not in expected},
        problems=problems,
    )
