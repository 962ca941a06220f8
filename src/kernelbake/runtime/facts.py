"""From probed ``Facts`` to a key that ``compat.check`` can compare with the baked one."""

from __future__ import annotations

from kernelbake.contract.key import CacheKey
from kernelbake.errors import EnvironmentProblem
from kernelbake.runtime.engines import EngineRuntime, Facts


def found_key(baked: CacheKey, facts: Facts) -> CacheKey:
    """The baked key with every measurable field replaced by what the probe found.

    ``driver_floor`` holds the *installed* driver, as ``compat.check`` expects. Fields that
    describe the model and serve arguments come from the image itself and stay as baked.
    """
    return baked.replace(
        engine_version=facts.engine_version,
        torch=facts.torch,
        triton=facts.triton,
        cuda=facts.cuda,
        flashinfer=facts.flashinfer,
        python=facts.python,
        arch=facts.arch,
        device=facts.device,
        driver_floor=facts.driver,
    )


def builder_entry(facts: Facts, host: str) -> dict[str, str]:
    """The compile report's ``builder`` entry, which the attestation copies."""
    entry = {"device": facts.device, "driver": facts.driver, "arch": facts.arch, "cuda": facts.cuda}
    if host:
        entry["host"] = host
    return entry


def probe(engine: EngineRuntime) -> Facts:
    """The engine's probe; a broken engine install becomes one line, not a traceback."""
    try:
        return engine.probe()
    except Exception as exc:
        raise EnvironmentProblem(
            f"probing the {engine.declaration.engine.value} engine failed: {type(exc).__name__}: {exc}",
            hint="is the engine installed in this image?",
        ) from None
