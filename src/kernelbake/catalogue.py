"""The GPU and engine catalogues (data files in ``kernelbake/data``), as frozen dataclasses."""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Mapping
from importlib import resources
from typing import Any

from kernelbake._suggest import did_you_mean
from kernelbake.contract.engines import Build, nearest_release
from kernelbake.contract.key import NONE, Engine
from kernelbake.contract.platform import Software
from kernelbake.errors import UnknownName
from kernelbake.validate import parse_yaml

__all__ = ["CPU", "Build", "Catalogue", "EngineRelease", "Gpu", "Validation", "load_catalogue"]

CPU = "cpu"


class Validation(enum.Enum):
    """How far a release's data has been proven (engines.yaml ``validated``)."""

    # Built, compiled and served from the bundle on an H200 (bench/results/vllm-*-h200*).
    H200 = "h200"
    # The same on an H100, the card the device tool lends for work that fits 78 GiB: a dense
    # model's image flow, the key matrix with none wrong and the FP8 MoE
    # (bench/results/vllm-*-h100*; tests/vllm/test_releases.py reads them).
    H100 = "h100"
    # Built, pushed, pulled and served by CI on the CPU (tests/integration).
    CPU = "cpu"
    # Data only: nobody has run it; the compile stage still refuses a base image whose
    # measured versions differ from these.
    NONE = "none"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gpu:
    name: str
    device_name: str
    gfd_product: tuple[str, ...]
    family: str
    compute_capability: str
    arch: str
    cdi: str
    min_driver: str

    @property
    def is_cpu(self) -> bool:
        """Runs CPU engine builds (the CPU itself, and the test stand-ins for GPU families)."""
        return self.compute_capability == NONE


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineRelease:
    engine: Engine
    build: Build
    validated: Validation
    # What the release ships, which the planned key records and the compile stage measures.
    software: Software
    transformers: str
    base_image: str

    @property
    def version(self) -> str:
        return self.software.engine_version


@dataclasses.dataclass(frozen=True)
class Catalogue:
    gpus: Mapping[str, Gpu]
    cuda_min_driver: Mapping[str, str]
    engines: Mapping[tuple[Engine, str, Build], EngineRelease]

    def gpu(self, name: str, *, where: str = "--gpu") -> Gpu:
        try:
            return self.gpus[name.lower()]
        except KeyError:
            raise UnknownName(f"{where}: unknown GPU {name!r}{did_you_mean(name, self.gpus)}") from None

    def gpu_by_device_name(self, device_name: str) -> Gpu | None:
        return next((g for g in self.gpus.values() if g.device_name == device_name), None)

    def gpu_by_product(self, product: str) -> Gpu | None:
        return next((g for g in self.gpus.values() if product in g.gfd_product), None)

    def supported(self, engine: Engine) -> str:
        """``0.26.0 (cuda: h200), 0.32.0 (cpu: cpu; cuda: h100)``: every listed release of
        ``engine`` with the level at which each build was validated."""
        by_version: dict[str, list[str]] = {}
        for (e, v, b), r in sorted(
            self.engines.items(), key=lambda kv: (_version_order(kv[0][1]), kv[0][2].value)
        ):
            if e is engine:
                by_version.setdefault(v, []).append(f"{b.value}: {r.validated.value}")
        return ", ".join(f"{v} ({'; '.join(builds)})" for v, builds in by_version.items())

    def engine(self, engine: Engine, version: str, build: Build, *, where: str) -> EngineRelease:
        try:
            return self.engines[(engine, version, build)]
        except KeyError:
            pass
        known = sorted({v for (e, v, _b) in self.engines if e is engine}, key=_version_order)
        if version in known:
            built = [v for (e, v, b) in self.engines if e is engine and b is build]
            nearest = nearest_release(version, built)
            raise UnknownName(
                f"{where}: {engine.value} {version} has no {build.value} build in kernelbake's data; "
                + (f"the nearest release with one is {nearest}; " if nearest != NONE else "")
                + f"supported: {self.supported(engine)}"
            )
        raise UnknownName(
            f"{where}: {engine.value} {version!r} is not a supported release; "
            f"the nearest is {nearest_release(version, known)}; "
            f"supported: {self.supported(engine)} (src/kernelbake/data/engines.yaml)"
        )

    def driver_floor(self, gpu: Gpu, cuda: str) -> str:
        """The higher of the chip's and the CUDA version's minimum driver."""
        floors = [v for v in (gpu.min_driver, self.cuda_min_driver.get(cuda, NONE)) if v != NONE]
        if cuda != NONE and cuda not in self.cuda_min_driver:
            raise UnknownName(
                f"no minimum driver known for CUDA {cuda!r}{did_you_mean(cuda, self.cuda_min_driver)}"
            )
        if not floors:
            return NONE
        return max(floors, key=lambda v: tuple(int(p) for p in v.split(".")))


# engines.yaml lists, per release and build, the software it ships (its version is the
# release's name).
_SHIPPED = tuple(f.name for f in dataclasses.fields(Software) if f.name != "engine_version")


def _version_order(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def _load(name: str) -> Any:
    # The package's own data, but parsed within the same bounds as every other YAML file: an
    # edited or replaced engines.yaml reads as one error line, never as a hang or a traceback.
    text = resources.files("kernelbake").joinpath("data", name).read_text()
    return parse_yaml(text, f"kernelbake/data/{name}")[0]


@functools.cache
def load_catalogue() -> Catalogue:
    gpus_doc = _load("gpus.yaml")
    gpus = {
        name: Gpu(
            name=name,
            device_name=str(entry["device_name"]),
            gfd_product=tuple(entry["gfd_product"]),
            family=str(entry["family"]),
            compute_capability=str(entry["compute_capability"]),
            arch=str(entry["arch"]),
            cdi=str(entry["cdi"]),
            min_driver=str(entry["min_driver"]),
        )
        for name, entry in gpus_doc["gpus"].items()
    }
    engines: dict[tuple[Engine, str, Build], EngineRelease] = {}
    for engine_name, releases in _load("engines.yaml").items():
        engine = Engine(engine_name)
        for version, entry in releases.items():
            for build_name, fields in entry["builds"].items():
                build = Build(build_name)
                values = {k: str(v) for k, v in fields.items() if k != "validated"}
                software = Software(engine_version=str(version), **{n: values.pop(n) for n in _SHIPPED})
                engines[(engine, str(version), build)] = EngineRelease(
                    engine=engine,
                    build=build,
                    validated=Validation(str(fields["validated"])),
                    software=software,
                    **values,
                )
    cuda = {str(k): str(v) for k, v in gpus_doc["cuda_min_driver"].items()}
    return Catalogue(gpus=gpus, cuda_min_driver=cuda, engines=engines)
