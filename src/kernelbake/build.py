"""The build driver: the only module that runs Docker.

For each target: render the context, write one bake file for all targets, then build stage
by stage (runtime → compile → final) so that a failure names its stage and its log; check the
image's labels against the planned key; push only then, and report the pullable digest.

Targets of different GPU families build at once, each family on its own builder (a docker
context ``kernelbake-<family>`` for a remote daemon, or a buildx builder of that name: a remote
BuildKit, buildx's Kubernetes driver on GPU nodes); targets of one family queue on it. A target
that fails stops nothing else, and nothing of it is pushed; ``kernelbake build`` then publishes
the model's variant index once every target is pushed (``kernelbake.fleet``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from kernelbake import bake
from kernelbake._wheel import build_wheel
from kernelbake.contract.key import key_from_labels
from kernelbake.contract.layout import CACHE_ROOT
from kernelbake.errors import BadInput, BuildFailed, EnvironmentProblem, KernelbakeError, RegistryError
from kernelbake.plan import BuildTarget
from kernelbake.progress import Progress
from kernelbake.render import BuildMode, Rendered, device_for, render, write_context
from kernelbake.runner import Result, Runner, run
from kernelbake.settings import Settings

_STAGE_WHAT = {
    "runtime": "base image, kernelbake install, target.json, model files",
    "compile": "kernelbake compile: measure the builder, compile, write the cache bundle",
    "final": "caches and manifest layers, labels, entrypoint",
    "push": "push to the registry",
}
BUILDER_PREFIX = "kernelbake-"
SETUP_BUILDER = "buildkit/setup-builder.sh"
_SYNTAX = "# syntax="


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


@dataclasses.dataclass(frozen=True)
class Built:
    target: BuildTarget
    ref: str
    # ``repo@sha256:…`` once pushed.
    pushed: str | None


def _ping_registries(targets: Sequence[BuildTarget], settings: Settings) -> None:
    """Stop before a long build when a registry to push to does not answer."""
    # Host-only (requests): the CLI imports this module, and the CLI also runs inside images.
    from kernelbake.oci import RegistryClient, parse_reference
    from kernelbake.remote import registry_reachable

    client = RegistryClient(settings, timeout=10)
    refs = {ref.registry: ref for ref in (parse_reference(t.ref) for t in targets)}
    for registry, ref in sorted(refs.items()):
        with registry_reachable(registry):
            client.ping(ref)


class Docker:
    """The docker CLI through the injectable runner; never parses Docker's messages."""

    def __init__(self, settings: Settings, runner: Runner = run, *, context: str | None = None) -> None:
        self.settings = settings
        self.runner = runner
        self.env: Mapping[str, str] = dict(settings.environ)
        # Another daemon (a GPU host's): every command of this family's targets goes there.
        self.context = context

    def __call__(
        self, *args: str, log: Path | None = None, capture: bool = False, env: Mapping[str, str] | None = None
    ) -> Result:
        prefix = ["--context", self.context] if self.context else []
        return self.runner(
            [self.settings.docker, *prefix, *args], env={**self.env, **(env or {})}, log=log, capture=capture
        )

    def on(self, context: str) -> Docker:
        return Docker(self.settings, self.runner, context=context)

    def check(self) -> bool:
        """Raise when Docker is missing or its daemon is down; True when buildx is there."""
        res = self("version", "--format", "{{.Server.Version}}", capture=True)
        if res.returncode != 0:
            detail = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise EnvironmentProblem(
                f"the Docker daemon is not reachable ({detail})",
                hint="start dockerd (make deps starts it) or set DOCKER_HOST",
            )
        return self("buildx", "version", capture=True).returncode == 0

    def builder_for(self, family: str) -> str | None:
        """The family's builder from buildkit/setup-builder.sh, when it exists."""
        name = f"{BUILDER_PREFIX}{family}"
        return name if self("buildx", "inspect", name, capture=True).returncode == 0 else None

    def context_for(self, family: str) -> str | None:
        """The family's docker context (a GPU host's daemon), when it exists."""
        name = f"{BUILDER_PREFIX}{family}"
        return name if self("context", "inspect", name, capture=True).returncode == 0 else None

    def has_image(self, ref: str) -> bool:
        return self("image", "inspect", "--format", "{{.Id}}", ref, capture=True).returncode == 0

    def labels(self, ref: str) -> dict[str, str]:
        res = self("image", "inspect", "--format", "{{json .Config.Labels}}", ref, capture=True)
        if res.returncode != 0:
            raise BuildFailed(f"{ref}: the built image is not in the local image store")
        return dict(json.loads(res.stdout or "{}") or {})

    def repo_digest(self, ref: str, repository: str) -> str:
        res = self("image", "inspect", "--format", "{{json .RepoDigests}}", ref, capture=True)
        digests = json.loads(res.stdout or "[]") if res.returncode == 0 else []
        found = [d for d in digests or [] if d.startswith(f"{repository}@")]
        if not found:
            raise RegistryError(f"{ref}: pushed, but Docker reports no digest for {repository}")
        return str(found[0])


@dataclasses.dataclass(frozen=True)
class Lane:
    """Where one GPU family's targets build: its daemon and, for container builders, its
    buildx builder (which then pushes the image itself)."""

    docker: Docker
    builder: str | None = None
    # The docker context or builder found for the family; None: this daemon's default builder.
    name: str | None = None

    @property
    def where(self) -> str:
        if self.builder is not None:
            return f"buildx builder {self.builder}"
        return f"docker context {self.name}" if self.name else "this Docker daemon"


def _require_gpu_builders(
    targets: Sequence[BuildTarget], lanes: Mapping[str, Lane], device: str | None
) -> None:
    """Before anything is built, pulled or pushed: every GPU target has its family's builder.
    This daemon's default builder has no GPU; a GPU target on it would pull gigabytes and
    fail only at its compile stage."""
    missing = {t.gpu.family: t for t in targets if not t.gpu.is_cpu and lanes[t.gpu.family].name is None}
    if not missing:
        return
    first = next(iter(missing.values())).gpu.family
    families = ", ".join(
        f"{BUILDER_PREFIX}{family} (for {t.gpu.name}, CDI device {device_for(t, device)})"
        for family, t in missing.items()
    )
    raise EnvironmentProblem(
        f"no GPU builder {families}: neither a docker context nor a buildx builder of that name, "
        "and this daemon's default builder has no GPU",
        hint=f"run {SETUP_BUILDER} {first}{'' if device is None else ' ' + device} on the build host "
        f"with that GPU, or create a docker context {BUILDER_PREFIX}{first} for a daemon that has the "
        "device (buildkit/README.md); nothing was built",
    )


class Driver:
    def __init__(self, settings: Settings, runner: Runner = run, *, stream: TextIO | None = None) -> None:
        self.settings = settings
        self.docker = Docker(settings, runner)
        self.stream = stream or sys.stderr

    def _fail(self, target: BuildTarget, stage: str, log: Path) -> BuildFailed:
        return BuildFailed(
            f"{target.name}: stage {stage!r} ({_STAGE_WHAT[stage]}) failed; log: {log}",
            hint="nothing was pushed",
        )

    def _bake(self, lane: Lane, bake_file: Path, bake_target: str, log: Path, metadata: Path) -> Result:
        args = ["buildx", "bake", "-f", str(bake_file), "--progress=plain"]
        if lane.builder:
            args += ["--builder", lane.builder, "--metadata-file", str(metadata)]
        return lane.docker(*args, bake_target, log=log)

    def _plain_build(
        self, lane: Lane, rendered: Rendered, layout: bake.Layout, stage: str, log: Path
    ) -> Result:
        """``docker build`` with BuildKit, for hosts without buildx (single mode only)."""
        args = ["build", "--progress=plain", "--target", stage, "-f", str(layout.context / "Dockerfile")]
        if stage == "final":
            args += ["-t", rendered.target.ref]
        if rendered.target.spec.model.local_dir is None and "HF_TOKEN" in lane.docker.env:
            args += ["--secret", bake.HF_TOKEN_SECRET]
        return lane.docker(*args, str(layout.context), log=log, env={"DOCKER_BUILDKIT": "1"})

    def _compile_two_phase(self, lane: Lane, rendered: Rendered, layout: bake.Layout, log: Path) -> Result:
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
            bake.compile_env_ref(rendered.target),
            "-m",
            "kernelbake",
            "compile",
            "--chown",
            f"{os.getuid()}:{os.getgid()}",
            log=log,
        )

    def lanes(self, families: Sequence[str], has_buildx: bool) -> dict[str, Lane]:
        """Each family's builder: its docker context, else its buildx builder, else this daemon."""
        lanes: dict[str, Lane] = {}
        for family in dict.fromkeys(families):
            context = self.docker.context_for(family)
            if context is not None:
                lanes[family] = Lane(self.docker.on(context), name=context)
            elif has_buildx and (builder := self.docker.builder_for(family)) is not None:
                lanes[family] = Lane(self.docker, builder, name=builder)
            else:
                lanes[family] = Lane(self.docker)
        return lanes

    def build(self, targets: Sequence[BuildTarget], options: BuildOptions) -> list[Built]:
        if not targets:
            raise BadInput("nothing to build")
        if options.max_parallel is not None and options.max_parallel < 1:
            raise BadInput(f"--max-parallel {options.max_parallel}: must be at least 1")
        has_buildx = self.docker.check()
        if options.mode is BuildMode.TWO_PHASE and not has_buildx:
            raise EnvironmentProblem(
                "a two-phase build needs docker buildx (named build contexts)",
                hint="install docker-buildx (make deps does)",
            )
        lanes = self.lanes([t.gpu.family for t in targets], has_buildx)
        _require_gpu_builders(targets, lanes, options.device)
        if options.push:
            _ping_registries(targets, self.settings)
        out = options.out.resolve()
        wheel = build_wheel(out / "wheels")
        rendered = [render(t, wheel=wheel.name, mode=options.mode, device=options.device) for t in targets]
        self._say_pulls(rendered, lanes)
        layouts = {r.target.name: bake.Layout(out / r.target.name) for r in rendered}
        groups = {}
        for r in rendered:
            layout = layouts[r.target.name]
            write_context(r, layout.context, wheel)
            hub = r.target.spec.model.local_dir is None
            secrets = [bake.HF_TOKEN_SECRET] if hub and "HF_TOKEN" in self.docker.env else []
            push_from_builder = options.push and lanes[r.target.gpu.family].builder is not None
            groups[r.target.name] = bake.bake_targets(r, layout, push=push_from_builder, secrets=secrets)
        bake_file = out / "docker-bake.json"
        bake_file.write_text(bake.dumps(bake.bake_document(groups)))
        print(f"kernelbake build: bake file {bake_file}", file=self.stream, flush=True)

        by_family: dict[str, list[Rendered]] = {}
        for r in rendered:
            by_family.setdefault(r.target.gpu.family, []).append(r)
        outcomes: dict[str, Built | KernelbakeError] = {}
        with (
            Progress([r.target.name for r in rendered], self.stream) as progress,
            concurrent.futures.ThreadPoolExecutor(max_workers=options.max_parallel or len(by_family)) as pool,
        ):

            def lane_work(family: str, queue: Sequence[Rendered]) -> None:
                # One family's targets one after another: they share its builder (its GPUs).
                for r in queue:
                    name = r.target.name
                    try:
                        built = self._build_one(
                            lanes[family], r, layouts[name], bake_file, options, has_buildx, progress
                        )
                    except KernelbakeError as exc:
                        outcomes[name] = exc
                        progress.done(name, "FAILED", str(exc))
                    else:
                        outcomes[name] = built
                        progress.done(name, "pushed" if built.pushed else "built", built.pushed or built.ref)

            for future in [pool.submit(lane_work, f, q) for f, q in by_family.items()]:
                future.result()
        if len(rendered) > 1:
            print(progress.summary(), file=self.stream, flush=True)
        failed = {n: o for n, o in outcomes.items() if isinstance(o, KernelbakeError)}
        if failed:
            if len(rendered) == 1:
                raise next(iter(failed.values()))
            done = [n for n in outcomes if n not in failed]
            raise BuildFailed(
                f"{len(failed)} of {len(rendered)} targets failed: "
                + "; ".join(e.message for e in failed.values()),
                hint=f"nothing of those was pushed{'; built: ' + ', '.join(done) if done else ''}; no index",
            )
        return [o for r in rendered if isinstance(o := outcomes[r.target.name], Built)]

    def _say_pulls(self, rendered: Sequence[Rendered], lanes: Mapping[str, Lane]) -> None:
        """What each builder will fetch from a registry before its first stage can run, said
        before the build: a vLLM base image is 10+ GB, and a builder without a registry fails
        on it only once the build is under way."""
        for family, lane in lanes.items():
            queue = [r for r in rendered if r.target.gpu.family == family]
            pulls = [
                f"base image {base} (not in its image store)"
                # A container builder's own store cannot be asked; a daemon's can.
                for base in dict.fromkeys(r.target.base_image for r in queue)
                if lane.builder is None and not lane.docker.has_image(base)
            ]
            # The rendered Dockerfile names the frontend it needs (the labs one for RUN --device).
            pulls += [
                f"Dockerfile frontend {line.removeprefix(_SYNTAX).strip()} (unless BuildKit has it cached)"
                for line in dict.fromkeys(
                    ln for r in queue for ln in r.dockerfile.splitlines() if ln.startswith(_SYNTAX)
                )
            ]
            if pulls:
                print(
                    f"kernelbake build: {lane.where} will pull: {'; '.join(pulls)}",
                    file=self.stream,
                    flush=True,
                )

    def _build_one(
        self,
        lane: Lane,
        rendered: Rendered,
        layout: bake.Layout,
        bake_file: Path,
        options: BuildOptions,
        has_buildx: bool,
        progress: Progress,
    ) -> Built:
        target = rendered.target
        for stage, bake_target in bake.step_names(rendered):
            if stage == "final" and rendered.mode is BuildMode.TWO_PHASE:
                log = layout.logs / "compile.log"
                progress.stage(target.name, "compile", str(log))
                if self._compile_two_phase(lane, rendered, layout, log).returncode != 0:
                    raise self._fail(target, "compile", log)
            log = layout.logs / f"{stage}.log"
            progress.stage(target.name, stage, str(log))
            if has_buildx:
                res = self._bake(lane, bake_file, bake_target, log, layout.metadata)
            else:
                res = self._plain_build(lane, rendered, layout, stage, log)
            if res.returncode != 0:
                raise self._fail(target, stage, log)
        if lane.builder is not None and options.push:
            # A container builder pushed the image itself, at the end of a complete build.
            return Built(target, target.ref, self._pushed_by_builder(target, layout))
        labels = lane.docker.labels(target.ref)
        if key_from_labels(labels) != target.key:
            raise BuildFailed(
                f"{target.ref}: the image's key labels differ from the planned key; not pushing"
            )
        if not options.push:
            return Built(target, target.ref, None)
        log = layout.logs / "push.log"
        progress.stage(target.name, "push", str(log))
        if lane.docker("push", target.ref, log=log).returncode != 0:
            raise RegistryError(f"{target.name}: push of {target.ref} failed; log: {log}")
        return Built(target, target.ref, lane.docker.repo_digest(target.ref, target.repository))

    def _pushed_by_builder(self, target: BuildTarget, layout: bake.Layout) -> str:
        try:
            meta = json.loads(layout.metadata.read_text())
            digest = meta[target.name]["containerimage.digest"]
        except (OSError, ValueError, KeyError) as exc:
            raise RegistryError(
                f"{target.name}: pushed, but {layout.metadata} has no digest ({exc})"
            ) from None
        return f"{target.repository}@{digest}"
