"""The build driver: the only module that runs Docker.

For each target: render the context, write one bake file for all targets, then build stage
by stage (runtime → compile → final) so that a failure names its stage and its log; check the
image's labels against the planned key; push only then, and report the pullable digest.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from kernelbake import bake
from kernelbake._wheel import build_wheel
from kernelbake.contract.key import key_from_labels
from kernelbake.contract.layout import CACHE_ROOT
from kernelbake.errors import BadInput, BuildFailed, EnvironmentProblem, RegistryError
from kernelbake.plan import BuildTarget
from kernelbake.render import BuildMode, Rendered, render, write_context
from kernelbake.runner import Result, Runner, run
from kernelbake.settings import Settings

_STAGE_WHAT = {
    "runtime": "base image, kernelbake install, target.json, model files",
    "compile": "kernelbake compile: measure the builder, compile, write the cache bundle",
    "final": "caches and manifest layers, labels, entrypoint",
    "push": "push to the registry",
}
BUILDER_PREFIX = "kernelbake-"


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildOptions:
    out: Path
    # Push after a complete build (the targets' repository is already on their refs).
    push: bool = False
    mode: BuildMode = BuildMode.SINGLE
    # CDI device for the compile step instead of the catalogue's (e.g. nvidia.com/gpu=0).
    device: str | None = None


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

    def __init__(self, settings: Settings, runner: Runner = run) -> None:
        self.settings = settings
        self.runner = runner
        self.env: Mapping[str, str] = dict(settings.environ)

    def __call__(
        self, *args: str, log: Path | None = None, capture: bool = False, env: Mapping[str, str] | None = None
    ) -> Result:
        return self.runner(
            [self.settings.docker, *args], env={**self.env, **(env or {})}, log=log, capture=capture
        )

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


class Driver:
    def __init__(self, settings: Settings, runner: Runner = run) -> None:
        self.settings = settings
        self.docker = Docker(settings, runner)

    def _fail(self, target: BuildTarget, stage: str, log: Path) -> BuildFailed:
        return BuildFailed(
            f"{target.name}: stage {stage!r} ({_STAGE_WHAT[stage]}) failed; log: {log}",
            hint="nothing was pushed",
        )

    def _bake(
        self, bake_file: Path, bake_target: str, builder: str | None, log: Path, metadata: Path
    ) -> Result:
        args = ["buildx", "bake", "-f", str(bake_file), "--progress=plain"]
        if builder:
            args += ["--builder", builder, "--metadata-file", str(metadata)]
        return self.docker(*args, bake_target, log=log)

    def _plain_build(self, rendered: Rendered, layout: bake.Layout, stage: str, log: Path) -> Result:
        """``docker build`` with BuildKit, for hosts without buildx (single mode only)."""
        args = ["build", "--progress=plain", "--target", stage, "-f", str(layout.context / "Dockerfile")]
        if stage == "final":
            args += ["-t", rendered.target.ref]
        if rendered.target.spec.model.local_dir is None and "HF_TOKEN" in self.docker.env:
            args += ["--secret", bake.HF_TOKEN_SECRET]
        return self.docker(*args, str(layout.context), log=log, env={"DOCKER_BUILDKIT": "1"})

    def _compile_two_phase(self, rendered: Rendered, layout: bake.Layout, log: Path) -> Result:
        if layout.caches.exists():
            shutil.rmtree(layout.caches)
        layout.caches.mkdir(parents=True)
        assert rendered.device is not None  # render refuses two-phase without a device
        return self.docker(
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

    def build(self, targets: Sequence[BuildTarget], options: BuildOptions) -> list[Built]:
        if not targets:
            raise BadInput("nothing to build")
        has_buildx = self.docker.check()
        if options.mode is BuildMode.TWO_PHASE and not has_buildx:
            raise EnvironmentProblem(
                "a two-phase build needs docker buildx (named build contexts)",
                hint="install docker-buildx (make deps does)",
            )
        if options.push:
            _ping_registries(targets, self.settings)
        out = options.out.resolve()
        wheel = build_wheel(out / "wheels")
        rendered = [render(t, wheel=wheel.name, mode=options.mode, device=options.device) for t in targets]
        builders = (
            {t.gpu.family: self.docker.builder_for(t.gpu.family) for t in targets} if has_buildx else {}
        )
        layouts = {r.target.name: bake.Layout(out / r.target.name) for r in rendered}
        groups = {}
        for r in rendered:
            layout = layouts[r.target.name]
            write_context(r, layout.context, wheel)
            hub = r.target.spec.model.local_dir is None
            secrets = [bake.HF_TOKEN_SECRET] if hub and "HF_TOKEN" in self.docker.env else []
            push_from_builder = options.push and builders.get(r.target.gpu.family) is not None
            groups[r.target.name] = bake.bake_targets(r, layout, push=push_from_builder, secrets=secrets)
        bake_file = out / "docker-bake.json"
        bake_file.write_text(bake.dumps(bake.bake_document(groups)))
        print(f"kernelbake build: bake file {bake_file}", file=sys.stderr, flush=True)
        return [
            self._build_one(r, layouts[r.target.name], bake_file, builders, options, has_buildx)
            for r in rendered
        ]

    def _build_one(
        self,
        rendered: Rendered,
        layout: bake.Layout,
        bake_file: Path,
        builders: Mapping[str, str | None],
        options: BuildOptions,
        has_buildx: bool,
    ) -> Built:
        target = rendered.target
        builder = builders.get(target.gpu.family)
        for stage, bake_target in bake.step_names(rendered):
            if stage == "final" and rendered.mode is BuildMode.TWO_PHASE:
                log = layout.logs / "compile.log"
                if self._compile_two_phase(rendered, layout, log).returncode != 0:
                    raise self._fail(target, "compile", log)
            log = layout.logs / f"{stage}.log"
            print(f"kernelbake build: {target.name}: stage {stage} (log {log})", file=sys.stderr, flush=True)
            if has_buildx:
                res = self._bake(bake_file, bake_target, builder, log, layout.metadata)
            else:
                res = self._plain_build(rendered, layout, stage, log)
            if res.returncode != 0:
                raise self._fail(target, stage, log)
        if builder is not None and options.push:
            # A container builder pushed the image itself, at the end of a complete build.
            return Built(target, target.ref, self._pushed_by_builder(target, layout))
        labels = self.docker.labels(target.ref)
        if key_from_labels(labels) != target.key:
            raise BuildFailed(
                f"{target.ref}: the image's key labels differ from the planned key; not pushing"
            )
        if not options.push:
            return Built(target, target.ref, None)
        log = layout.logs / "push.log"
        if self.docker("push", target.ref, log=log).returncode != 0:
            raise RegistryError(f"{target.name}: push of {target.ref} failed; log: {log}")
        return Built(target, target.ref, self.docker.repo_digest(target.ref, target.repository))

    def _pushed_by_builder(self, target: BuildTarget, layout: bake.Layout) -> str:
        try:
            meta = json.loads(layout.metadata.read_text())
            digest = meta[target.name]["containerimage.digest"]
        except (OSError, ValueError, KeyError) as exc:
            raise RegistryError(
                f"{target.name}: pushed, but {layout.metadata} has no digest ({exc})"
            ) from None
        return f"{target.repository}@{digest}"
