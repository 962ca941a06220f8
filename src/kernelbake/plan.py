"""spec + GPU names → build targets. Pure: no Docker, no network, no environment reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kernelbake import __version__
from kernelbake._suggest import did_you_mean
from kernelbake.catalogue import Build, Catalogue, EngineRelease, Gpu, load_catalogue
from kernelbake.contract.key import CacheKey
from kernelbake.errors import SpecError
from kernelbake.labels import derived_labels
from kernelbake.spec import ImageSpec

ALL = "all"


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildTarget:
    spec: ImageSpec
    gpu: Gpu
    release: EngineRelease
    base_image: str
    key: CacheKey
    repository: str
    tag: str
    labels: tuple[tuple[str, str], ...]

    @property
    def name(self) -> str:
        """Bake target name: ``<spec>-<gpu>`` with bake's allowed characters."""
        return f"{self.spec.name}-{self.gpu.name}".replace(".", "_")

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.name,
            "gpu": self.gpu.name,
            "device_name": self.gpu.device_name,
            "arch": self.gpu.arch,
            "cdi": self.gpu.cdi,
            "base_image": self.base_image,
            "engine_build": self.release.build.value,
            "validated": self.release.validated.value,
            "ref": self.ref,
            "key": str(self.key),
            "key_digest": self.key.digest,
            "labels": dict(self.labels),
        }


def _key(spec: ImageSpec, gpu: Gpu, release: EngineRelease, catalogue: Catalogue) -> CacheKey:
    s = spec.serve
    return CacheKey(
        engine=spec.engine,
        **dataclasses.asdict(release.software),
        arch=gpu.arch,
        device=gpu.device_name,
        driver_floor=catalogue.driver_floor(gpu, release.software.cuda),
        model=spec.model.id,
        revision=spec.model.revision,
        model_path=spec.model.path,
        dtype=s.dtype.value,
        quantization=s.quantization.value,
        tp=s.tensor_parallel_size,
        pp=s.pipeline_parallel_size,
        ep=s.expert_parallel_size,
        max_model_len=s.max_model_len,
        max_num_batched_tokens=s.max_num_batched_tokens,
        compilation=s.compilation_digest,
        engine_env=s.env_digest,
        kernelbake=__version__,
    )


def _oci_labels(spec: ImageSpec, gpu: Gpu, base: str, tag: str) -> dict[str, str]:
    return {
        "org.opencontainers.image.title": spec.name,
        "org.opencontainers.image.description": (
            f"{spec.model.id} with {spec.engine.value} {spec.engine_version} kernels baked for {gpu.device_name}"
        ),
        "org.opencontainers.image.version": tag,
        "org.opencontainers.image.base.name": base,
    }


def resolve_gpus(spec: ImageSpec, requested: Sequence[str], catalogue: Catalogue) -> list[Gpu]:
    names = list(spec.targets) if not requested or list(requested) == [ALL] else list(requested)
    for i, n in enumerate(spec.targets):
        if n not in catalogue.gpus:
            raise SpecError(
                f"{spec.where(f'targets[{i}]')}: unknown GPU {n!r}{did_you_mean(n, catalogue.gpus)}"
            )
    gpus = [catalogue.gpu(n) for n in names]
    for g in gpus:
        if g.name not in spec.targets:
            raise SpecError(
                f"{spec.where('targets')}: GPU {g.name!r} is not a target of this spec "
                f"(targets: {', '.join(spec.targets)}); add it to targets or pick one of those"
            )
    return gpus


def plan(
    spec: ImageSpec,
    gpus: Sequence[str] = (),
    *,
    registry: str = "kernelbake",
    catalogue: Catalogue | None = None,
) -> list[BuildTarget]:
    """One target per GPU. ``gpus`` empty or ``["all"]`` means every target in the spec."""
    cat = catalogue or load_catalogue()
    where = spec.where("engine.version")
    targets = []
    for gpu in resolve_gpus(spec, gpus, cat):
        # The CPU target takes the engine's CPU build, a GPU its CUDA build.
        release = cat.engine(
            spec.engine, spec.engine_version, Build.CPU if gpu.is_cpu else Build.CUDA, where=where
        )
        base = spec.base_for(gpu.family) or release.base_image
        key = _key(spec, gpu, release, cat)
        tag = key.tag(gpu.name)
        # Every dev.kernelbake.* label from the key (the GPU ones through its device), so that
        # check_labels can tell an edited one from what kernelbake wrote.
        labels = {**_oci_labels(spec, gpu, base, tag), **derived_labels(key, cat)}
        targets.append(
            BuildTarget(
                spec=spec,
                gpu=gpu,
                release=release,
                base_image=base,
                key=key,
                repository=f"{registry.rstrip('/')}/{spec.name}",
                tag=tag,
                labels=tuple(sorted(labels.items())),
            )
        )
    return targets
