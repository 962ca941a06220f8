"""Image specs: YAML in ``images/``, validated into frozen dataclasses.

Every error names ``file:line: field`` and, for unknown names, the closest valid one.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kernelbake._suggest import did_you_mean
from kernelbake.errors import SpecError
from kernelbake.key import Engine
from kernelbake.textfile import read_text

_REVISION = re.compile(r"^[0-9a-f]{40}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# Same path at compile and serve time: vLLM hashes the model path.
MODEL_ROOT = "/models"


class Dtype(enum.Enum):
    AUTO = "auto"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


_DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
}


class Quantization(enum.Enum):
    NONE = "none"
    FP8 = "fp8"
    AWQ = "awq"
    AWQ_MARLIN = "awq_marlin"
    GPTQ = "gptq"
    GPTQ_MARLIN = "gptq_marlin"
    COMPRESSED_TENSORS = "compressed-tensors"
    BITSANDBYTES = "bitsandbytes"
    MXFP4 = "mxfp4"
    MODELOPT = "modelopt"
    MODELOPT_FP4 = "modelopt_fp4"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSource:
    id: str
    revision: str
    path: str
    # A directory shipped with the spec (config only, random weights) instead of a hub model.
    local_dir: Path | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeArgs:
    """The serve arguments that shape compiled code; all of them enter the key."""

    dtype: Dtype = Dtype.BFLOAT16
    quantization: Quantization = Quantization.NONE
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    expert_parallel_size: int = 1
    max_model_len: int = 4096
    max_num_batched_tokens: int = 8192
    # Not in vLLM's compile hash, but it sizes the buffers its Triton kernels are specialised
    # on, so compile and serve pin the same value instead of each taking a context default.
    max_num_seqs: int = 256
    # Canonical JSON (sorted keys, no spaces), so equal configs digest equally.
    compilation_config: str = "{}"
    # Engine env pinned in the image and hashed by the engine.
    env: tuple[tuple[str, str], ...] = ()
    # Arguments passed through to the engine that do not change compiled code.
    extra_args: tuple[str, ...] = ()

    @property
    def compilation_digest(self) -> str:
        return hashlib.sha256(self.compilation_config.encode()).hexdigest()[:16]

    @property
    def env_digest(self) -> str:
        return env_digest(dict(self.env))


def env_digest(env: Mapping[str, str]) -> str:
    """Digest of pinned engine env vars; computed the same way at plan time and in preflight."""
    canonical = json.dumps(sorted(env.items()), separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompileOptions:
    # (batch, sequence length) pairs the torch engine runs; vLLM derives its own shapes.
    shapes: tuple[tuple[int, int], ...] = ((1, 32), (1, 128))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageSpec:
    name: str
    source: Path
    model: ModelSource
    engine: Engine
    engine_version: str
    serve: ServeArgs
    compile: CompileOptions
    targets: tuple[str, ...]
    # GPU family (or "default") → base image reference; empty means the engine's default.
    base: tuple[tuple[str, str], ...] = ()

    def base_for(self, family: str) -> str | None:
        bases = dict(self.base)
        return bases.get(family, bases.get("default"))


# -- loading -------------------------------------------------------------------------------

_TOP = {"name", "model", "engine", "serve", "compile", "targets", "base"}
_MODEL = {"id", "revision", "local", "path"}
_ENGINE = {"name", "version"}
# Every ServeArgs field is a serve: key, spelled the same.
_SERVE = {f.name for f in dataclasses.fields(ServeArgs)}
_SERVE_INTS = tuple(f.name for f in dataclasses.fields(ServeArgs) if f.type == "int")
_COMPILE = {"shapes"}


class _Doc:
    """The parsed YAML plus its node tree, to put line numbers in messages."""

    def __init__(self, path: Path) -> None:
        self.path = path
        text = read_text(path, "spec", error=SpecError)
        if not text.strip():
            raise SpecError(f"{path}: the spec is empty", hint="see images/tiny-llama.yaml for one")
        try:
            self.node = yaml.compose(text, Loader=yaml.SafeLoader)
            self.data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise SpecError(f"{where}: malformed YAML: {problem}") from None

    def line(self, dotted: str) -> int | None:
        node = self.node
        line = node.start_mark.line + 1 if node is not None else None
        for part in dotted.split("."):
            if not isinstance(node, yaml.MappingNode):
                break
            for k, v in node.value:
                if k.value == part:
                    line, node = k.start_mark.line + 1, v
                    break
            else:
                break
        return line

    def error(self, dotted: str, message: str) -> SpecError:
        line = self.line(dotted)
        where = f"{self.path}:{line}" if line else str(self.path)
        return SpecError(f"{where}: {dotted}: {message}")


def _mapping(doc: _Doc, value: Any, field: str, allowed: set[str], required: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise doc.error(field, f"expected a mapping, got {type(value).__name__}")
    for k in value:
        if k not in allowed:
            prefix = f"{field}." if field else ""
            raise doc.error(f"{prefix}{k}", f"unknown key{did_you_mean(str(k), allowed)}")
    for k in sorted(required):
        if k not in value:
            prefix = f"{field}." if field else ""
            raise doc.error(field or k, f"missing required key {prefix}{k}")
    return value


def _positive_int(doc: _Doc, value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise doc.error(field, f"expected a positive integer, got {value!r}")
    return value


def _enum(
    doc: _Doc, cls: type[enum.Enum], value: Any, field: str, aliases: Mapping[str, str] | None = None
) -> Any:
    text = "none" if value is None else str(value).lower()
    text = (aliases or {}).get(text, text)
    try:
        return cls(text)
    except ValueError:
        raise doc.error(
            field, f"unknown value {value!r}{did_you_mean(text, [m.value for m in cls])}"
        ) from None


def _model(doc: _Doc, raw: Any, name: str) -> ModelSource:
    m = _mapping(doc, raw, "model", _MODEL, set())
    path = m.get("path")
    if path is not None and (not isinstance(path, str) or not path.startswith("/")):
        raise doc.error("model.path", f"must be an absolute path inside the image, got {path!r}")
    default_path = f"{MODEL_ROOT}/{name}"
    if "local" in m:
        if "revision" in m:
            raise doc.error("model.revision", "a local model has no revision (its files are hashed)")
        local = (doc.path.parent / str(m["local"])).resolve()
        if not (local / "config.json").is_file():
            raise doc.error("model.local", f"{local} has no config.json")
        return ModelSource(
            id=str(m.get("id", f"local/{name}")),
            revision="sha256-" + tree_digest(local),
            path=path or default_path,
            local_dir=local,
        )
    if "id" not in m or not isinstance(m["id"], str) or "/" not in m["id"]:
        raise doc.error(
            "model.id", f"expected a hub id like 'org/name' (or model.local), got {m.get('id')!r}"
        )
    revision = m.get("revision")
    if not isinstance(revision, str) or not _REVISION.match(revision):
        raise doc.error("model.revision", f"must be a pinned 40-hex commit, got {revision!r}")
    return ModelSource(id=m["id"], revision=revision, path=path or default_path)


def tree_digest(root: Path) -> str:
    """Content digest of a directory (relative paths and bytes), independent of mtimes."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _serve(doc: _Doc, raw: Any) -> ServeArgs:
    s = _mapping(doc, raw if raw is not None else {}, "serve", _SERVE, set())
    kw: dict[str, Any] = {}
    if "dtype" in s:
        kw["dtype"] = _enum(doc, Dtype, s["dtype"], "serve.dtype", _DTYPE_ALIASES)
    if "quantization" in s:
        kw["quantization"] = _enum(doc, Quantization, s["quantization"], "serve.quantization")
    for f in _SERVE_INTS:
        if f in s:
            kw[f] = _positive_int(doc, s[f], f"serve.{f}")
    ep = kw.get("expert_parallel_size", 1)
    if ep not in (1, kw.get("tensor_parallel_size", 1)):
        raise doc.error(
            "serve.expert_parallel_size",
            "must be 1 or equal tensor_parallel_size (vLLM's EP spans the TP group)",
        )
    if "compilation_config" in s:
        cc = s["compilation_config"]
        if not isinstance(cc, dict):
            raise doc.error("serve.compilation_config", f"expected a mapping, got {type(cc).__name__}")
        kw["compilation_config"] = json.dumps(cc, sort_keys=True, separators=(",", ":"))
    if "env" in s:
        env = s["env"]
        if not isinstance(env, dict):
            raise doc.error("serve.env", f"expected a mapping of VAR: value, got {type(env).__name__}")
        for k in env:
            if not isinstance(k, str) or not _ENV_NAME.match(k):
                raise doc.error(f"serve.env.{k}", "not an environment variable name")
        kw["env"] = tuple(sorted((k, str(v)) for k, v in env.items()))
    if "extra_args" in s:
        extra = s["extra_args"]
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            raise doc.error("serve.extra_args", "expected a list of strings")
        kw["extra_args"] = tuple(extra)
    return ServeArgs(**kw)


def _compile(doc: _Doc, raw: Any) -> CompileOptions:
    c = _mapping(doc, raw if raw is not None else {}, "compile", _COMPILE, set())
    if "shapes" not in c:
        return CompileOptions()
    shapes = c["shapes"]
    ok = (
        isinstance(shapes, list)
        and shapes
        and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and x > 0 for x in p)
            for p in shapes
        )
    )
    if not ok:
        raise doc.error("compile.shapes", "expected a list of [batch, seq_len] pairs of positive integers")
    return CompileOptions(shapes=tuple((int(b), int(t)) for b, t in shapes))


def load_spec(path: str | Path) -> ImageSpec:
    """Parse and validate one spec file. Catalogue checks (GPU names, engine versions) happen in plan."""
    doc = _Doc(Path(path))
    top = _mapping(doc, doc.data, "", _TOP, {"name", "model", "engine", "targets"})
    name = top["name"]
    if not isinstance(name, str) or not _NAME.match(name):
        raise doc.error("name", f"must be a lowercase image name ([a-z0-9._-]), got {name!r}")
    eng = _mapping(doc, top["engine"], "engine", _ENGINE, {"name", "version"})
    engine = _enum(doc, Engine, eng["name"], "engine.name")
    version = eng["version"]
    if not isinstance(version, str) or not version:
        raise doc.error("engine.version", f"expected an exact version string like '0.26.0', got {version!r}")
    targets = top["targets"]
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise doc.error("targets", "expected a non-empty list of GPU names")
    base = top.get("base") or {}
    if not isinstance(base, dict) or not all(isinstance(v, str) for v in base.values()):
        raise doc.error("base", "expected a mapping of GPU family (or 'default') to image reference")
    return ImageSpec(
        name=name,
        source=doc.path,
        model=_model(doc, top["model"], name),
        engine=engine,
        engine_version=version,
        serve=_serve(doc, top.get("serve")),
        compile=_compile(doc, top.get("compile")),
        targets=tuple(t.lower() for t in targets),
        base=tuple(sorted((str(k), v) for k, v in base.items())),
    )
