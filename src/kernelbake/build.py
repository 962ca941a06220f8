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
import enum
import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from kernelbake import bake
from kernelbake._wheel import build_wheel
from kernelbake.contract.artifact import (
    CacheArtifactFacts,
    EngineImage,
    InvalidArtifact,
    artifact_facts,
    artifact_ref,
)
from kernelbake.contract.key import key_from_labels
from kernelbake.contract.layout import CACHE_ROOT, MANIFEST
from kernelbake.errors import BadInput, BuildFailed, EnvironmentProblem, KernelbakeError, RegistryError
from kernelbake.plan import BuildTarget
from kernelbake.progress import Progress, PushTally
from kernelbake.render import BuildMode, Rendered, device_for, engine_env, render, write_context
from kernelbake.runner import Result, Runner, run
from kernelbake.settings import Settings

_STAGE_WHAT = {
    "runtime": "base image, kernelbake install, target.json, model files",
    "compile": "kernelbake compile: measure the builder, compile, write the cache bundle",
    "final": "caches and manifest layers, labels, entrypoint",
    "caches": "export the compiled caches for the cache artifact",
    "cache-artifact": "the cache-only artifact: cache layers, manifest, labels",
    "push": "push to the registry",
}
BUILDER_PREFIX = "kernelbake-"
SETUP_BUILDER = "buildkit/setup-builder.sh"
_SYNTAX = "# syntax="


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
class CacheBuilt:
    ref: str  # ``repo:tag-cache``
    pushed: str | None  # ``repo@sha256:…`` once pushed
    facts: CacheArtifactFacts


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
        self,
        *args: str,
        log: Path | None = None,
        capture: bool = False,
        env: Mapping[str, str] | None = None,
        on_line: Callable[[str], None] | None = None,
        cwd: Path | None = None,
    ) -> Result:
        prefix = ["--context", self.context] if self.context else []
        return self.runner(
            [self.settings.docker, *prefix, *args],
            env={**self.env, **(env or {})},
            cwd=cwd,
            log=log,
            capture=capture,
            on_line=on_line,
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
        self._has_buildx = False

    def _fail(self, target: BuildTarget, stage: str, log: Path) -> BuildFailed:
        return BuildFailed(
            f"{target.name}: stage {stage!r} ({_STAGE_WHAT[stage]}) failed; log: {log}",
            hint="nothing was pushed",
        )

    def _bake(self, lane: Lane, bake_file: Path, bake_target: str, log: Path, metadata: Path) -> Result:
        args = ["buildx", "bake", "-f", str(bake_file), "--progress=plain"]
        if lane.builder:
            args += ["--builder", lane.builder, "--metadata-file", str(metadata)]
        # buildx 0.20 and newer refuse a bake that reads or writes outside its working directory
        # ("additional privileges requested") unless each path is granted with --allow, a flag
        # 0.13 does not have. Every path of a bake file is under the file's own directory (the
        # build's out, or one target's folder there), so running it there needs no grant.
        return lane.docker(*args, bake_target, log=log, cwd=bake_file.parent)

    def _plain_build(
        self, lane: Lane, rendered: Rendered, layout: bake.Layout, stage: str, log: Path
    ) -> Result:
        """``docker build`` with BuildKit, for hosts without buildx (single mode only)."""
        args = ["build", "--progress=plain", "--target", stage, "-f", str(layout.context / "Dockerfile")]
        if stage == "final":
            args += ["-t", rendered.target.ref]
        elif stage == "caches":
            args += ["--output", f"type=local,dest={layout.caches}"]
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
        has_buildx = self._preconditions(targets, options)
        lanes = self.lanes([t.gpu.family for t in targets], has_buildx)
        _require_gpu_builders(targets, lanes, options.device)
        if options.push:
            _ping_registries(targets, self.settings)
        out = options.out.resolve()
        wheel = build_wheel(out / "wheels")
        rendered = [render(t, wheel=wheel.name, mode=options.mode, device=options.device) for t in targets]
        self._say_pulls(rendered, lanes)
        layouts = {r.target.name: bake.Layout(out / r.target.name) for r in rendered}
        bake_file = self._write_bake(rendered, layouts, lanes, wheel, options)
        outcomes = self._run_lanes(rendered, layouts, lanes, bake_file, options, has_buildx)
        _raise_failures(len(rendered), outcomes)
        return [o for r in rendered if isinstance(o := outcomes[r.target.name], Built)]

    def _preconditions(self, targets: Sequence[BuildTarget], options: BuildOptions) -> bool:
        """What is wrong with the request before anything is built; whether buildx is there."""
        if not targets:
            raise BadInput("nothing to build")
        if options.max_parallel is not None and options.max_parallel < 1:
            raise BadInput(f"--max-parallel {options.max_parallel}: must be at least 1")
        has_buildx = self._has_buildx = self.docker.check()
        if options.mode is BuildMode.TWO_PHASE and not has_buildx:
            raise EnvironmentProblem(
                "a two-phase build needs docker buildx (named build contexts)",
                hint="install docker-buildx (make deps does)",
            )
        return has_buildx

    def _write_bake(
        self,
        rendered: Sequence[Rendered],
        layouts: Mapping[str, bake.Layout],
        lanes: Mapping[str, Lane],
        wheel: Path,
        options: BuildOptions,
    ) -> Path:
        """Each target's build context, and the one bake file that builds them all."""
        out = options.out.resolve()
        groups = {}
        for r in rendered:
            layout = layouts[r.target.name]
            write_context(r, layout.context, wheel)
            hub = r.target.spec.model.local_dir is None
            secrets = [bake.HF_TOKEN_SECRET] if hub and "HF_TOKEN" in self.docker.env else []
            push_from_builder = (
                options.push and options.publish.image and lanes[r.target.gpu.family].builder is not None
            )
            groups[r.target.name] = bake.bake_targets(
                r, layout, push=push_from_builder, secrets=secrets, cache_artifact=options.publish.cache
            )
        bake_file = out / "docker-bake.json"
        bake_file.write_text(bake.dumps(bake.bake_document(groups)))
        print(f"kernelbake build: bake file {bake_file}", file=self.stream, flush=True)
        return bake_file

    def _run_lanes(
        self,
        rendered: Sequence[Rendered],
        layouts: Mapping[str, bake.Layout],
        lanes: Mapping[str, Lane],
        bake_file: Path,
        options: BuildOptions,
        has_buildx: bool,
    ) -> dict[str, Built | KernelbakeError]:
        """Every target built, families in parallel; what each ended as (a failure is kept,
        not raised, so that the other targets finish)."""
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
                        shown = built.published or [built.ref, *([built.cache.ref] if built.cache else [])]
                        progress.done(name, "pushed" if built.published else "built", ", ".join(shown))

            for future in [pool.submit(lane_work, f, q) for f, q in by_family.items()]:
                future.result()
        if len(rendered) > 1:
            print(progress.summary(), file=self.stream, flush=True)
        return outcomes

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
        for stage, bake_target in bake.step_names(rendered, cache_artifact=options.publish.cache):
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
        if lane.builder is not None and options.push and options.publish.image:
            # A container builder pushed the image itself, at the end of a complete build.
            pushed: str | None = self._pushed_by_builder(target.name, layout.metadata, target.repository)
        else:
            labels = lane.docker.labels(target.ref)
            if key_from_labels(labels) != target.key:
                raise BuildFailed(
                    f"{target.ref}: the image's key labels differ from the planned key; not pushing"
                )
            pushed = None
            if options.push and options.publish.image:
                pushed = self._push(lane, target, target.ref, layout, progress)
        cache = (
            self._cache_artifact(lane, rendered, layout, options, progress) if options.publish.cache else None
        )
        return Built(target, target.ref, pushed, cache)

    def _push(
        self, lane: Lane, target: BuildTarget, ref: str, layout: bake.Layout, progress: Progress
    ) -> str:
        log = layout.logs / ("push.log" if ref == target.ref else "push-cache-artifact.log")
        progress.stage(target.name, "push", str(log))
        # Its per-layer lines count the layers up, for the line a quiet push gets.
        if (
            lane.docker("push", ref, log=log, on_line=progress.watch(target.name, PushTally())).returncode
            != 0
        ):
            raise RegistryError(f"{target.name}: push of {ref} failed; log: {log}")
        return lane.docker.repo_digest(ref, target.repository)

    def _cache_artifact(
        self, lane: Lane, rendered: Rendered, layout: bake.Layout, options: BuildOptions, progress: Progress
    ) -> CacheBuilt:
        """Build (and push) the target's cache-only artifact from the caches the build compiled."""
        from kernelbake.oci.types import sha256_digest

        target = rendered.target
        manifest = layout.caches / MANIFEST
        try:
            data = manifest.read_bytes()
        except OSError:
            raise BuildFailed(
                f"{target.name}: {manifest} is missing after compile; the cache artifact needs it",
                hint="nothing of this target's artifact was pushed",
            ) from None
        command, launch = self._engine_command(lane, target, layout)
        facts = CacheArtifactFacts(
            engine=engine_image(lane.docker, target.base_image, self.settings),
            manifest_digest=sha256_digest(data),
            command=tuple(command),
            # The image's own variables win over the launch defaults, as in the image.
            env=tuple(sorted({**launch, **dict(engine_env(target))}.items())),
        )
        ref = artifact_ref(target.ref)
        push_from_builder = options.push and lane.builder is not None
        layout.artifact_bake.write_text(
            bake.dumps(
                bake.artifact_document(
                    rendered, layout, ref=ref, labels=facts.labels(), push=push_from_builder
                )
            )
        )
        log = layout.logs / "cache-artifact.log"
        progress.stage(target.name, "cache-artifact", str(log))
        name = bake.artifact_target_name(rendered)
        if self._has_buildx:
            res = self._bake(lane, layout.artifact_bake, name, log, layout.artifact_metadata)
        else:
            # Single mode only (no named contexts): the same caches, from the Dockerfile's stage.
            labels = [x for k, v in sorted(facts.labels().items()) for x in ("--label", f"{k}={v}")]
            res = lane.docker(
                "build", "--progress=plain", "--target", "cache-artifact", *labels, "-t", ref,
                "-f", str(layout.context / "Dockerfile"), str(layout.context),
                log=log, env={"DOCKER_BUILDKIT": "1"},
            )  # fmt: skip
        if res.returncode != 0:
            raise self._fail(target, "cache-artifact", log)
        if push_from_builder:
            return CacheBuilt(
                ref, self._pushed_by_builder(name, layout.artifact_metadata, target.repository), facts
            )
        labels_seen = lane.docker.labels(ref)
        try:
            same = (
                key_from_labels(labels_seen) == target.key
                and artifact_facts(labels_seen, source=ref) == facts
            )
        except (InvalidArtifact, BadInput):
            same = False
        if not same:
            raise BuildFailed(
                f"{ref}: the artifact's labels differ from what the build recorded; not pushing"
            )
        pushed = self._push(lane, target, ref, layout, progress) if options.push else None
        return CacheBuilt(ref, pushed, facts)

    def _engine_command(
        self, lane: Lane, target: BuildTarget, layout: bake.Layout
    ) -> tuple[list[str], dict[str, str]]:
        """The engine command and launch variables, as the built image's own ``serve`` has them."""
        log = layout.logs / "engine-command.log"
        res = lane.docker(
            "run", "--rm", "--network", "none", "--entrypoint", "python3", target.ref,
            "-m", "kernelbake", "engine-command",
            capture=True,
        )  # fmt: skip
        log.write_text(res.stdout + res.stderr)
        try:
            doc = json.loads((res.stdout.strip().splitlines() or ["null"])[-1])
            command, launch = doc["command"], doc["env"]
            if not (isinstance(command, list) and isinstance(launch, dict)):
                raise TypeError("not a list and an object")
        except (ValueError, TypeError, KeyError) as exc:
            raise BuildFailed(
                f"{target.ref}: `kernelbake engine-command` gave no command ({exc}); log: {log}",
                hint="nothing of this target's artifact was pushed",
            ) from None
        return [str(a) for a in command], {str(k): str(v) for k, v in launch.items()}

    def _pushed_by_builder(self, name: str, metadata: Path, repository: str) -> str:
        try:
            meta = json.loads(metadata.read_text())
            digest = meta[name]["containerimage.digest"]
        except (OSError, ValueError, KeyError) as exc:
            raise RegistryError(f"{name}: pushed, but {metadata} has no digest ({exc})") from None
        return f"{repository}@{digest}"


def engine_image(docker: Docker, name: str, settings: Settings) -> EngineImage:
    """The image the runtime stage was built on, by digest: the daemon's copy (what a docker-
    driver build used) when it has one, else the registry's. Its config digest is what stays
    the same when the image is pushed elsewhere, so that is what the artifact names first."""
    res = docker("image", "inspect", "--format", "{{json .}}", name, capture=True)
    if res.returncode == 0:
        try:
            doc = json.loads(res.stdout)
            config = str(doc["Id"])
            repo = name.rsplit("@", 1)[0]
            repo = repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo
            digests = [str(d) for d in doc.get("RepoDigests") or []]
        except (ValueError, KeyError, TypeError):
            raise BuildFailed(f"{name}: docker image inspect gave no image id") from None
        # Its own repository's digest first; another one's (the image pushed elsewhere under
        # another name, e.g. a mirror the cluster pulls from) names the same manifest when this
        # daemon pushed both (same layers, compressed once).
        found = sorted(digests, key=lambda d: not d.startswith(f"{repo}@"))
        return EngineImage(
            name=name, config_digest=config, digest=found[0].rsplit("@", 1)[1] if found else None
        )
    from kernelbake.oci import RegistryClient, parse_reference
    from kernelbake.remote import image_manifest

    try:
        ref = parse_reference(name)
        client = RegistryClient(settings, timeout=30)
        top = client.get_manifest(ref)
        manifest = image_manifest(client, ref.with_digest(top.digest), top)
    except (RegistryError, BadInput) as exc:
        raise BuildFailed(
            f"{name}: the engine image is neither in the daemon nor readable from its registry ({exc})",
            hint="the cache artifact must name the engine image by digest; pull it first",
        ) from None
    return EngineImage(name=name, config_digest=manifest.config.digest, digest=top.digest)


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
