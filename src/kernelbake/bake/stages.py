"""One build, in the order it runs: each target's rendered context and the one bake file for
all targets, then each target's stages (runtime → compile → final, and the caches export for a
cache artifact) one at a time on its lane, so that a failure names its stage and its log.

A two-phase build compiles between runtime and final in ``docker run --device``; a host without
buildx builds each stage with ``docker build`` (single mode only)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from kernelbake.bake import bakefile
from kernelbake.bake.bakefile import Layout
from kernelbake.bake.lanes import Lane
from kernelbake.contract.layout import CACHE_ROOT
from kernelbake.errors import BuildFailed
from kernelbake.plan import BuildTarget
from kernelbake.progress import Progress
from kernelbake.render import BuildMode, Rendered, write_context
from kernelbake.runner import Result

_STAGE_WHAT = {
    "runtime": "base image, kernelbake install, target.json, model files",
    "compile": "kernelbake compile: measure the builder, compile, write the cache bundle",
    "final": "caches and manifest layers, labels, entrypoint",
    "caches": "export the compiled caches for the cache artifact",
    "cache-artifact": "the cache-only artifact: cache layers, manifest, labels",
}


def stage_failed(target: BuildTarget, stage: str, log: Path) -> BuildFailed:
    return BuildFailed(
        f"{target.name}: stage {stage!r} ({_STAGE_WHAT[stage]}) failed; log: {log}",
        hint="nothing was pushed",
    )


def write_bake(
    rendered: Sequence[Rendered],
    layouts: Mapping[str, Layout],
    lanes: Mapping[str, Lane],
    wheel: Path,
    out: Path,
    *,
    env: Mapping[str, str],
    push: bool,
    cache_artifact: bool,
    stream: TextIO,
    criu: Path | None = None,
) -> Path:
    """Each target's build context, and the one bake file that builds them all. ``push``: the
    image is to be pushed, which a container builder does itself at the end of its build."""
    groups = {}
    for r in rendered:
        layout = layouts[r.target.name]
        write_context(r, layout.context, wheel, criu)
        hub = r.target.spec.model.local_dir is None
        secrets = [bakefile.HF_TOKEN_SECRET] if hub and "HF_TOKEN" in env else []
        push_from_builder = push and lanes[r.target.gpu.family].builder is not None
        groups[r.target.name] = bakefile.bake_targets(
            r, layout, push=push_from_builder, secrets=secrets, cache_artifact=cache_artifact
        )
    bake_file = out / "docker-bake.json"
    bake_file.write_text(bakefile.dumps(bakefile.bake_document(groups)))
    print(f"kernelbake build: bake file {bake_file}", file=stream, flush=True)
    return bake_file


def run_bake(lane: Lane, bake_file: Path, bake_target: str, log: Path, metadata: Path) -> Result:
    args = ["buildx", "bake", "-f", str(bake_file), "--progress=plain"]
    if lane.builder:
        args += ["--builder", lane.builder, "--metadata-file", str(metadata)]
    # buildx 0.20 and newer refuse a bake that reads or writes outside its working directory
    # ("additional privileges requested") unless each path is granted with --allow, a flag
    # 0.13 does not have. Every path of a bake file is under the file's own directory (the
    # build's out, or one target's folder there), so running it there needs no grant.
    return lane.docker(*args, bake_target, log=log, cwd=bake_file.parent)


def _plain_build(lane: Lane, rendered: Rendered, layout: Layout, stage: str, log: Path) -> Result:
    """``docker build`` with BuildKit, for hosts without buildx (single mode only)."""
    args = ["build", "--progress=plain", "--target", stage, "-f", str(layout.context / "Dockerfile")]
    if stage == "final":
        args += ["-t", rendered.target.ref]
    elif stage == "caches":
        args += ["--output", f"type=local,dest={layout.caches}"]
    if rendered.target.spec.model.local_dir is None and "HF_TOKEN" in lane.docker.env:
        args += ["--secret", bakefile.HF_TOKEN_SECRET]
    return lane.docker(*args, str(layout.context), log=log, env={"DOCKER_BUILDKIT": "1"})


def _compile_two_phase(lane: Lane, rendered: Rendered, layout: Layout, log: Path) -> Result:
    if layout.caches.exists():
        shutil.rmtree(layout.caches)
    layout.caches.mkdir(parents=True)
    assert rendered.device is not None  # render refuses two-phase without a device
    return lane.docker(
        "run",
        "--rm",
        "--device",
        rendered.device,
        "--shm-size=16g",
        "-v",
        f"{layout.caches}:{CACHE_ROOT}",
        "--entrypoint",
        "python3",
        bakefile.compile_env_ref(rendered.target),
        "-m",
        "kernelbake",
        "compile",
        "--chown",
        f"{os.getuid()}:{os.getgid()}",
        log=log,
    )


def build_stages(
    lane: Lane,
    rendered: Rendered,
    layout: Layout,
    bake_file: Path,
    *,
    cache_artifact: bool,
    has_buildx: bool,
    progress: Progress,
) -> None:
    """Every stage of one target, in order; raises at the first that fails."""
    target = rendered.target
    for stage, bake_target in bakefile.step_names(rendered, cache_artifact=cache_artifact):
        if stage == "final" and rendered.mode is BuildMode.TWO_PHASE:
            log = layout.logs / "compile.log"
            progress.stage(target.name, "compile", str(log))
            if _compile_two_phase(lane, rendered, layout, log).returncode != 0:
                raise stage_failed(target, "compile", log)
        log = layout.logs / f"{stage}.log"
        progress.stage(target.name, stage, str(log))
        if has_buildx:
            res = run_bake(lane, bake_file, bake_target, log, layout.metadata)
        else:
            res = _plain_build(lane, rendered, layout, stage, log)
        if res.returncode != 0:
            raise stage_failed(target, stage, log)
