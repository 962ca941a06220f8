"""The docker CLI, through the injectable runner: the only place a build or a push runs Docker."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from kernelbake.contract import jsondoc
from kernelbake.errors import BuildFailed, EnvironmentProblem, RegistryError
from kernelbake.runner import Result, Runner, run
from kernelbake.settings import Settings

BUILDER_PREFIX = "kernelbake-"


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
        return dict(jsondoc.loads(res.stdout or "{}") or {})

    def repo_digest(self, ref: str, repository: str) -> str:
        res = self("image", "inspect", "--format", "{{json .RepoDigests}}", ref, capture=True)
        digests = jsondoc.loads(res.stdout or "[]") if res.returncode == 0 else []
        found = [d for d in digests or [] if d.startswith(f"{repository}@")]
        if not found:
            raise RegistryError(f"{ref}: pushed, but Docker reports no digest for {repository}")
        return str(found[0])
