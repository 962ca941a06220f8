"""``kernelbake compile``: the build stage that turns an engine's warm-up into a cache bundle.

It measures the builder (the engine's probe), refuses to bake when the measurement differs
from the planned key in target.json, runs the engine's compile with every cache pointed at
``<cache_root>/<kind>``, and writes the manifest with a ``builder`` entry.
"""

from __future__ import annotations

import os
from pathlib import Path

from kernelbake.contract.compat import check
from kernelbake.contract.layout import MANIFEST, kind_dir
from kernelbake.contract.manifest import UNSET, Manifest
from kernelbake.contract.platform import Platform
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BuildFailed, KeyMismatch
from kernelbake.runtime import env as runtime_env
from kernelbake.runtime import redact
from kernelbake.runtime.bundle import readable_by_all, write_manifest
from kernelbake.runtime.engines import EngineRuntime, get_engine, measure
from kernelbake.runtime.env import RuntimeEnv


def _prepare_root(root: Path, engine: EngineRuntime) -> None:
    """Each declared kind gets a directory, present even when empty, because the final
    stage COPYs every one of them into its own layer."""
    leftovers = [p for p in root.rglob("*") if p.is_file()] if root.exists() else []
    if leftovers:
        raise BuildFailed(
            f"cache root {root} already holds {len(leftovers)} files (e.g. {leftovers[0]}); "
            "refusing to bake caches that this compile did not produce"
        )
    for kind in engine.declaration.cache_kinds:
        kind_dir(root, kind).mkdir(parents=True, exist_ok=True)


def _builder_entry(platform: Platform, host: str) -> dict[str, str]:
    """The compile report's ``builder`` entry, which the attestation copies."""
    entry = {
        "device": platform.device,
        "driver": platform.driver,
        "arch": platform.arch,
        "cuda": platform.software.cuda,
    }
    if host:
        entry["host"] = host
    return entry


def _chown(root: Path, owner: tuple[int, int]) -> None:
    for dirpath, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.chown(Path(dirpath) / name, *owner)
    os.chown(root, *owner)


def run_compile(
    env: RuntimeEnv,
    *,
    engine: EngineRuntime | None = None,
    cache_root: Path | None = None,
    owner: tuple[int, int] | None = None,
) -> Manifest:
    target = TargetConfig.load(env.target_file)
    engine = engine or get_engine(target.key.engine)
    platform = measure(engine)
    match = check(target.key, platform)
    if not match.usable:
        reasons = "; ".join(str(r) for r in match.blocking)
        raise KeyMismatch(
            f"this builder does not match the planned key, refusing to bake: {reasons}",
            hint="build on the GPU and base image the spec targets, or fix the catalogue entry",
        )
    root = cache_root or Path(target.cache_root)
    _prepare_root(root, engine)
    variables = {
        **dict(target.serve.env),
        **engine.declaration.cache_env_for(root, target.key),
    }
    runtime_env.apply(variables)
    result = engine.compile(target, root)
    effective = {**env.environ, **variables}
    # Secret-carrying values (VLLM_API_KEY is hashed by vLLM 0.26) are kept as digests only.
    hashed = {n: redact.shown(n, effective.get(n, UNSET)) for n in engine.hashed_env_names()}
    hashed.update(result.hashed_env)
    report = {**result.report, "builder": _builder_entry(platform, env.builder)}
    manifest = write_manifest(
        root,
        target.key,
        engine.declaration.cache_kinds,
        hashed_env=hashed,
        report=report,
        ranks=result.ranks,
        logs=result.logs,
    )
    if not manifest.files:
        raise BuildFailed(f"{engine.declaration.engine.value} compile left no cache files under {root}")
    # The image may run as any uid (docker run --user, Kubernetes runAsUser); COPY keeps modes.
    readable_by_all(root)
    if owner is not None:
        _chown(root, owner)
    totals = ", ".join(f"{k}: {t['files']} files, {t['bytes']} B" for k, t in manifest.totals().items())
    if manifest.ranks:
        totals += "; per rank: " + ", ".join(
            f"rank {r}: {t['files']} files" for r, t in manifest.rank_totals().items()
        )
    print(f"kernelbake compile: baked under {root} ({totals}); manifest {root / MANIFEST}", flush=True)
    return manifest
