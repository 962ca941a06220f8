"""Where each GPU family's targets build: a docker context ``kernelbake-<family>`` for a remote
daemon, else a buildx builder of that name (a remote BuildKit, buildx's Kubernetes driver on GPU
nodes), else this daemon. Targets of different families build at once, one lane each; targets
of one family queue on theirs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TextIO

from kernelbake.bake.docker import BUILDER_PREFIX, Docker
from kernelbake.errors import EnvironmentProblem
from kernelbake.plan import BuildTarget
from kernelbake.render import Rendered, device_for

SETUP_BUILDER = "buildkit/setup-builder.sh"
_SYNTAX = "# syntax="


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


def find_lanes(docker: Docker, families: Sequence[str], has_buildx: bool) -> dict[str, Lane]:
    """Each family's builder: its docker context, else its buildx builder, else this daemon."""
    lanes: dict[str, Lane] = {}
    for family in dict.fromkeys(families):
        context = docker.context_for(family)
        if context is not None:
            lanes[family] = Lane(docker.on(context), name=context)
        elif has_buildx and (builder := docker.builder_for(family)) is not None:
            lanes[family] = Lane(docker, builder, name=builder)
        else:
            lanes[family] = Lane(docker)
    return lanes


def require_gpu_builders(
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


def say_pulls(rendered: Sequence[Rendered], lanes: Mapping[str, Lane], stream: TextIO) -> None:
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
            print(f"kernelbake build: {lane.where} will pull: {'; '.join(pulls)}", file=stream, flush=True)
