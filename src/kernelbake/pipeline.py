"""``kernelbake build``, end to end: each target built (``kernelbake.bake``), then published
(``kernelbake.publish``), families in parallel.

For each target: render the context, write one bake file for all targets, then build stage by
stage (runtime → compile → final) on its family's lane so that a failure names its stage and its
log; check the image's labels against the planned key; push only then, build and push the
cache-only artifact when asked, and report the pullable digests. A target that fails stops
nothing else, and nothing of it is pushed; ``kernelbake build`` then publishes the model's
variant index once every target is pushed (``kernelbake.publish.index``). Signing is its own
command, run on the pushed digests (``kernelbake.signing``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from kernelbake._wheel import build_wheel
from kernelbake.bake.bakefile import Layout
from kernelbake.bake.docker import Docker
from kernelbake.bake.lanes import Lane, find_lanes, require_gpu_builders, say_pulls
from kernelbake.bake.stages import build_stages, write_bake
from kernelbake.errors import BadInput, BuildFailed, EnvironmentProblem, KernelbakeError
from kernelbake.plan import BuildTarget
from kernelbake.progress import Progress
from kernelbake.publish.artifact import CacheBuilt, publish_artifact
from kernelbake.publish.push import ping_registries, publish_image
from kernelbake.render import BuildMode, Rendered, criu_problem, render
from kernelbake.runner import Runner, run
from kernelbake.settings import Settings


class Publish(enum.Enum):
    """What a build publishes per target: the image, the cache-only artifact, or both."""

    IMAGE = "image"
    CACHE = "cache"
    BOTH = "both"

    @property
    def image(self) -> bool:
        return self is not Publish.CACHE

    @property
    def cache(self) -> bool:
        return self is not Publish.IMAGE


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildOptions:
    out: Path
    # Push after a complete build (the targets' repository is already on their refs).
    push: bool = False
    mode: BuildMode = BuildMode.SINGLE
    # CDI device for the compile step instead of the catalogue's (e.g. nvidia.com/gpu=0).
    device: str | None = None
    # GPU families built at once (each on its own builder); None: all of them.
    max_parallel: int | None = None
    # The image is built either way (the artifact's engine command is read from it); this
    # says what is pushed.
    publish: Publish = Publish.IMAGE


@dataclasses.dataclass(frozen=True)
class Built:
    target: BuildTarget
    ref: str
    # ``repo@sha256:…`` once pushed.
    pushed: str | None
    cache: CacheBuilt | None = None

    @property
    def published(self) -> list[str]:
        """What was pushed (image, artifact), for the variant index."""
        return [p for p in (self.pushed, self.cache.pushed if self.cache else None) if p]


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What every target's work shares once the build has started."""

    options: BuildOptions
    lanes: Mapping[str, Lane]
    layouts: Mapping[str, Layout]
    bake_file: Path
    has_buildx: bool


class Driver:
    def __init__(self, settings: Settings, runner: Runner = run, *, stream: TextIO | None = None) -> None:
        self.settings = settings
        self.docker = Docker(settings, runner)
        self.stream = stream or sys.stderr

    def build(self, targets: Sequence[BuildTarget], options: BuildOptions) -> list[Built]:
        has_buildx = self._preconditions(targets, options)
        lanes = find_lanes(self.docker, [t.gpu.family for t in targets], has_buildx)
        require_gpu_builders(targets, lanes, options.device)
        if options.push:
            ping_registries(targets, self.settings)
        out = options.out.resolve()
        wheel = build_wheel(out / "wheels")
        rendered = [render(t, wheel=wheel.name, mode=options.mode, device=options.device) for t in targets]
        say_pulls(rendered, lanes, self.stream)
        layouts = {r.target.name: Layout(out / r.target.name) for r in rendered}
        bake_file = write_bake(
            rendered,
            layouts,
            lanes,
            wheel,
            out,
            env=self.docker.env,
            push=options.push and options.publish.image,
            cache_artifact=options.publish.cache,
            stream=self.stream,
            criu=self.settings.criu,
        )
        outcomes = self._run_lanes(rendered, _Plan(options, lanes, layouts, bake_file, has_buildx))
        _raise_failures(len(rendered), outcomes)
        return [o for r in rendered if isinstance(o := outcomes[r.target.name], Built)]

    def _preconditions(self, targets: Sequence[BuildTarget], options: BuildOptions) -> bool:
        """What is wrong with the request before anything is built; whether buildx is there."""
        if not targets:
            raise BadInput("nothing to build")
        if options.max_parallel is not None and options.max_parallel < 1:
            raise BadInput(f"--max-parallel {options.max_parallel}: must be at least 1")
        for t in targets:
            if problem := criu_problem(t, self.settings.criu):
                raise problem
        has_buildx = self.docker.check()
        if options.mode is BuildMode.TWO_PHASE and not has_buildx:
            raise EnvironmentProblem(
                "a two-phase build needs docker buildx (named build contexts)",
                hint="install docker-buildx (make deps does)",
            )
        return has_buildx

    def _run_lanes(self, rendered: Sequence[Rendered], plan: _Plan) -> dict[str, Built | KernelbakeError]:
        """Every target built, families in parallel; what each ended as (a failure is kept,
        not raised, so that the other targets finish)."""
        by_family: dict[str, list[Rendered]] = {}
        for r in rendered:
            by_family.setdefault(r.target.gpu.family, []).append(r)
        outcomes: dict[str, Built | KernelbakeError] = {}
        workers = plan.options.max_parallel or len(by_family)
        with (
            Progress([r.target.name for r in rendered], self.stream) as progress,
            concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool,
        ):

            def lane_work(family: str, queue: Sequence[Rendered]) -> None:
                # One family's targets one after another: they share its builder (its GPUs).
                for r in queue:
                    name = r.target.name
                    try:
                        built = self._build_one(plan.lanes[family], r, plan, progress)
                    except KernelbakeError as exc:
                        outcomes[name] = exc
                        progress.done(name, "FAILED", str(exc))
                    else:
                        outcomes[name] = built
                        shown = built.published or [built.ref, *([built.cache.ref] if built.cache else [])]
                        progress.done(name, "pushed" if built.published else "built", ", ".join(shown))

            for future in [pool.submit(lane_work, f, q) for f, q in by_family.items()]:
                future.result()
        if len(rendered) > 1:
            print(progress.summary(), file=self.stream, flush=True)
        return outcomes

    def _build_one(self, lane: Lane, rendered: Rendered, plan: _Plan, progress: Progress) -> Built:
        """One target: its stages, then its image and its cache artifact published."""
        target, options = rendered.target, plan.options
        layout = plan.layouts[target.name]
        build_stages(
            lane,
            rendered,
            layout,
            plan.bake_file,
            cache_artifact=options.publish.cache,
            has_buildx=plan.has_buildx,
            progress=progress,
        )
        pushed = publish_image(lane, target, layout, progress, push=options.push and options.publish.image)
        cache = (
            publish_artifact(
                lane,
                rendered,
                layout,
                self.settings,
                push=options.push,
                has_buildx=plan.has_buildx,
                progress=progress,
            )
            if options.publish.cache
            else None
        )
        return Built(target, target.ref, pushed, cache)


def _raise_failures(targets: int, outcomes: Mapping[str, Built | KernelbakeError]) -> None:
    """One target's own error, or one error naming every failed target and what was built."""
    failed = {n: o for n, o in outcomes.items() if isinstance(o, KernelbakeError)}
    if not failed:
        return
    if targets == 1:
        raise next(iter(failed.values()))
    done = [n for n in outcomes if n not in failed]
    raise BuildFailed(
        f"{len(failed)} of {targets} targets failed: " + "; ".join(e.message for e in failed.values()),
        hint=f"nothing of those was pushed{'; built: ' + ', '.join(done) if done else ''}; no index",
    )
