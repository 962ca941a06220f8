"""One model, several GPUs: reading the image index that lists every GPU variant (which
``kernelbake.publish.index`` pushes), and the resolver that picks the variant for a GPU.

``read_index`` and ``resolve`` answer which variant a GPU should run, through
``contract.compat.rank_variants``, the ranking admission uses too. Host-only (``requests``):
commands import it when they run.
"""

from __future__ import annotations

import dataclasses
import platform
import shutil
from collections.abc import Mapping

from kernelbake.catalogue import CPU, Catalogue, load_catalogue
from kernelbake.contract.artifact import ArtifactKind
from kernelbake.contract.compat import Candidate, rank_variants
from kernelbake.contract.platform import arch_for
from kernelbake.contract.variants import (
    Variant,
    is_variant_index,
    of_kind,
    variants_from_index,
)
from kernelbake.errors import BadInput, EnvironmentProblem, UnknownName
from kernelbake.gfd import GPU_LABELS, PRODUCT, node_gpu
from kernelbake.oci import Manifest, Reference, RegistryClient, parse_reference
from kernelbake.runner import Result, Runner, run


@dataclasses.dataclass(frozen=True)
class FleetIndex:
    ref: Reference  # pinned to the index digest
    variants: tuple[Variant, ...]

    def pinned(self, variant: Variant) -> str:
        return f"{self.ref.name}@{variant.digest}"


@dataclasses.dataclass(frozen=True)
class Resolution:
    index: FleetIndex
    found: Mapping[str, str]
    candidates: tuple[Candidate, ...]  # best first
    # The entries of the kind asked for (images, or cache artifacts), that candidates index.
    variants: tuple[Variant, ...] = ()

    @property
    def best(self) -> Candidate | None:
        first = self.candidates[0] if self.candidates else None
        return first if first is not None and first.fits else None

    def variant(self, candidate: Candidate) -> Variant:
        return self.variants[candidate.index]


def read_index(reference: str, *, client: RegistryClient | None = None) -> FleetIndex | None:
    """The variant index ``reference`` names, or None when it names a single image."""
    return read_top(reference, client=client)[1]


def read_top(reference: str, *, client: RegistryClient | None = None) -> tuple[Manifest, FleetIndex | None]:
    """What ``reference`` names (one manifest GET) and, when that is a model's GPU index, the
    index. A command that goes on with a single image passes the manifest on (``top=``), so
    that it reads a tag once: a second read could find the tag moved between the two."""
    ref = parse_reference(reference)
    top = (client or RegistryClient()).get_manifest(ref)
    return top, index_of(ref, top)


def index_of(ref: Reference, top: Manifest) -> FleetIndex | None:
    if not top.is_index or not is_variant_index(top.doc):
        return None
    pinned = Reference(ref.registry, ref.repository, digest=top.digest)
    return FleetIndex(pinned, variants_from_index(top.doc, source=pinned.pinned()))


def resolve(
    index: FleetIndex, found: Mapping[str, str], kind: ArtifactKind = ArtifactKind.IMAGE
) -> Resolution:
    """The entries of ``kind`` ranked for ``found``: an image is never picked as a cache
    artifact, nor the other way round."""
    variants = of_kind(index.variants, kind)
    candidates = rank_variants([v.key for v in variants], found)
    return Resolution(index, dict(found), tuple(candidates), variants)


def _describe(found: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in found.items())


# -- what GPU is "here" or on a node ----------------------------------------------------------

# A device name no catalogue entry has: ranks every variant of the arch as "same arch".
UNKNOWN_DEVICE = "(not labelled)"


def found_for_product(product: str, catalogue: Catalogue | None = None) -> dict[str, str]:
    """Platform facts for a GFD product label value (``NVIDIA-H100-80GB-HBM3``, ``…-SHARED``,
    ``…-MIG-1g.10gb``)."""
    cat = catalogue or load_catalogue()
    gpu = node_gpu(product, cat)
    if gpu.device is None or gpu.arch is None:
        known = sorted(p for g in cat.gpus.values() for p in g.gfd_product[:1])
        raise UnknownName(
            f"--gpu-product: {product!r} is not a GPU product in kernelbake's catalogue "
            f"(known: {', '.join(known)})"
        )
    return {"device": gpu.device, "arch": gpu.arch}


def found_for_labels(labels: Mapping[str, str], catalogue: Catalogue | None = None) -> dict[str, str]:
    """Platform facts for a node's GFD labels. Without ``nvidia.com/gpu.product`` the device is
    unknown, so at best a variant of the same arch fits."""
    cat = catalogue or load_catalogue()
    if PRODUCT in labels:
        return found_for_product(labels[PRODUCT], cat)
    gpus = [
        g
        for g in cat.gpus.values()
        if g.gfd_product
        and all(node_gpu(g.gfd_product[0], cat).labels.get(k) == v for k, v in labels.items())
    ]
    arches = sorted({g.arch for g in gpus})
    if not set(labels) & set(GPU_LABELS) or len(arches) != 1:
        raise BadInput(
            f"--node-labels: {', '.join(f'{k}={v}' for k, v in labels.items())} do not name one GPU arch "
            f"(matching arches: {', '.join(arches) or 'none'}); give {PRODUCT}"
        )
    return {"device": UNKNOWN_DEVICE, "arch": arches[0]}


def parse_labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        if not eq or not name:
            raise BadInput(f"--node-labels: {part!r} is not key=value")
        labels[name] = value
    if not labels:
        raise BadInput("--node-labels: no labels given (key=value,…)")
    return labels


def found_here(runner: Runner = run) -> dict[str, str]:
    """This machine's GPU 0 as ``nvidia-smi`` reports it, or the CPU when there is none."""
    if shutil.which("nvidia-smi") is None:
        return {"device": CPU, "arch": platform.machine()}
    try:
        res: Result | None = runner(
            ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
            capture=True,
        )
    except EnvironmentProblem:
        res = None
    if res is None or res.returncode != 0 or not res.stdout.strip():
        return {"device": CPU, "arch": platform.machine()}
    name, cap, driver = (p.strip() for p in res.stdout.splitlines()[0].split(",")[:3])
    major, _, minor = cap.partition(".")
    return {"device": name, "arch": arch_for((int(major), int(minor or 0))), "driver": driver}
