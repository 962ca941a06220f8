"""Build target → Dockerfile and build context. Rendering is pure; ``write_context`` writes.

One template serves every target: CPU targets compile in a plain ``RUN``; GPU targets either
request their CDI device in the ``RUN`` (``single`` mode, labs frontend) or compile in a
``docker run --device`` whose output directory replaces the ``caches`` stage (``two-phase``).
"""

from __future__ import annotations

import dataclasses
import enum
import shutil
from collections.abc import Sequence
from pathlib import Path

import jinja2

from kernelbake import __version__
from kernelbake._wheel import templates_dir
from kernelbake.contract.artifact import LABEL_ARTIFACT, ArtifactKind
from kernelbake.contract.engines import DECLARATIONS
from kernelbake.contract.layout import PINNED_MANIFEST, TARGET_FILE, CacheKind
from kernelbake.contract.snapshot import CRIU_PREFIX
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput, EnvironmentProblem
from kernelbake.plan import BuildTarget

NO_DEVICE = "none"


class BuildMode(enum.Enum):
    SINGLE = "single"
    TWO_PHASE = "two-phase"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rendered:
    target: BuildTarget
    mode: BuildMode
    # The CDI device the compile step requests (None on CPU without an override).
    device: str | None
    kinds: tuple[CacheKind, ...]
    wheel: str
    dockerfile: str
    target_json: str


def _dq(value: object) -> str:
    """A double-quoted Dockerfile word: no variable expansion, no line breaks."""
    text = str(value)
    if "\n" in text or "\r" in text:
        raise BadInput(f"value {text[:40]!r}... contains a line break; labels and env must be one line")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def _assignments(pairs: Sequence[tuple[str, str]], indent: int) -> str:
    """``A="1" \\⏎    B="2"``: one name=value per line, for ENV and LABEL."""
    return f" \\\n{' ' * indent}".join(f"{name}={_dq(value)}" for name, value in pairs)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["dq"] = _dq
    env.filters["assignments"] = _assignments
    return env


def target_config(target: BuildTarget) -> TargetConfig:
    spec = target.spec
    return TargetConfig(key=target.key, gpu=target.gpu.name, serve=spec.serve, shapes=spec.compile.shapes)


def engine_env(target: BuildTarget) -> list[tuple[str, str]]:
    """The variables the image sets for its engine: the spec's pinned ones and those that
    point the engine at the caches. A stock image given a cache artifact needs the same."""
    engine = DECLARATIONS[target.key.engine]
    cache_env = engine.cache_env_for(Path(target_config(target).cache_root), target.key)
    return sorted({**dict(target.spec.serve.env), **cache_env}.items())


def device_for(target: BuildTarget, override: str | None = None) -> str | None:
    if override:
        return override
    return None if target.gpu.cdi == NO_DEVICE else target.gpu.cdi


def render(
    target: BuildTarget,
    *,
    wheel: str,
    mode: BuildMode = BuildMode.SINGLE,
    device: str | None = None,
) -> Rendered:
    """The engine's cache kinds and variables come from its declaration in the contract, so
    rendering needs no engine installed."""
    engine = DECLARATIONS[target.key.engine]
    dev = device_for(target, device)
    if mode is BuildMode.TWO_PHASE and dev is None:
        raise BadInput(
            f"{target.name}: a two-phase build runs the compile step with a CDI device, "
            f"and {target.gpu.name} has none; pass --cdi-device or use --mode single"
        )
    config = target_config(target)
    env = engine_env(target)
    text = (
        _environment()
        .get_template("Dockerfile.j2")
        .render(
            version=__version__,
            name=target.name,
            mode=mode.value,
            key=str(target.key),
            key_digest=target.key.digest,
            device=dev,
            base_image=target.base_image,
            wheel=wheel,
            target_file=TARGET_FILE,
            pinned_manifest=PINNED_MANIFEST,
            cache_root=config.cache_root,
            local_model=target.spec.model.local_dir is not None,
            criu=target.spec.snapshot,
            criu_prefix=CRIU_PREFIX,
            model_path=target.key.model_path,
            env=env,
            kinds=[k.value for k in engine.cache_kinds],
            labels=list(target.labels),
            artifact_labels=[*target.labels, (LABEL_ARTIFACT, ArtifactKind.CACHE.value)],
        )
    )
    return Rendered(
        target=target,
        mode=mode,
        device=dev,
        kinds=engine.cache_kinds,
        wheel=wheel,
        dockerfile=text,
        target_json=config.to_json(),
    )


def criu_problem(target: BuildTarget, prefix: Path | None) -> EnvironmentProblem | None:
    """Why ``prefix`` cannot be the CRIU a ``snapshot: true`` target copies in; None if it can
    (or the target takes none). Asked before anything is written or built."""
    has = prefix is not None and (prefix / "bin" / "criu").is_file() and (prefix / "criu.lock").is_file()
    if not target.spec.snapshot or has:
        return None
    return EnvironmentProblem(
        f"{target.spec.where('snapshot')}: the image is to carry CRIU, and {prefix} holds no "
        "CRIU prefix (bin/criu, criu.lock)",
        hint="run `make criu` (images/base/criu/install.sh build/criu), or set KERNELBAKE_CRIU_PREFIX",
    )


def write_context(rendered: Rendered, directory: Path, wheel_path: Path, criu: Path | None = None) -> Path:
    """Write ``Dockerfile``, ``target.json``, ``wheels/``, (local models) ``model/`` and (spec
    ``snapshot: true``) ``criu/``, a copy of the prefix ``criu``."""
    if problem := criu_problem(rendered.target, criu):
        raise problem
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    (directory / "Dockerfile").write_text(rendered.dockerfile)
    (directory / "target.json").write_text(rendered.target_json)
    # COPY keeps the mode, and serve trusts target.json only while no group or other may write
    # it (runtime.trusted): a umask of 002 must not make every image start cold.
    (directory / "target.json").chmod(0o644)
    (directory / "wheels").mkdir()
    shutil.copy2(wheel_path, directory / "wheels" / rendered.wheel)
    local = rendered.target.spec.model.local_dir
    if local is not None:
        shutil.copytree(local, directory / "model")
    if rendered.target.spec.snapshot and criu is not None:  # a prefix: criu_problem checked it
        # Links kept as links: the prefix's libraries are symlinked to their sonames.
        shutil.copytree(criu, directory / "criu", symlinks=True)
    return directory


__all__ = [
    "BuildMode",
    "Rendered",
    "criu_problem",
    "device_for",
    "engine_env",
    "render",
    "target_config",
    "write_context",
]
