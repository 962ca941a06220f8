"""Kubernetes nodes' GPUs as NVIDIA GPU Feature Discovery (GFD) labels them.

``nvidia.com/gpu.product`` is the device name with spaces as ``-`` (``-SHARED`` appended under
time-slicing or MPS, ``-MIG-<profile>`` for a MIG slice), ``nvidia.com/gpu.family`` and
``nvidia.com/gpu.compute.major``/``minor`` the chip. Admission and ``kernelbake resolve`` read
nodes through this one module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from kernelbake.catalogue import CPU, Catalogue

PRODUCT = "nvidia.com/gpu.product"
FAMILY = "nvidia.com/gpu.family"
CC_MAJOR = "nvidia.com/gpu.compute.major"
CC_MINOR = "nvidia.com/gpu.compute.minor"
GPU_LABELS = (PRODUCT, FAMILY, CC_MAJOR, CC_MINOR)
SHARED = "-SHARED"
MIG = "-MIG-"


@dataclasses.dataclass(frozen=True)
class NodeGpu:
    product: str
    # None for a product the catalogue does not know.
    device: str | None
    arch: str | None
    labels: Mapping[str, str]


def product_for(device: str) -> str:
    """The GFD product label value for a device name."""
    return device.replace(" ", "-")


def node_gpu(product: str, catalogue: Catalogue) -> NodeGpu:
    base = product.removesuffix(SHARED)
    base, mig, profile = base.partition(MIG)
    gpu = catalogue.gpu_by_product(base)
    if gpu is None or gpu.name == CPU:
        return NodeGpu(product, None, None, {PRODUCT: product})
    major, _, minor = gpu.compute_capability.partition(".")
    device = f"{gpu.device_name} MIG {profile}" if mig else gpu.device_name
    labels = {PRODUCT: product, FAMILY: gpu.family, CC_MAJOR: major, CC_MINOR: minor}
    return NodeGpu(product, device, gpu.arch, labels)
