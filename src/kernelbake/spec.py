"""Image specs: YAML in ``images/``, validated into frozen dataclasses.

Every error names ``file:line: field`` and, for unknown names, the closest valid one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from kernelbake.contract.key import Engine
from kernelbake.contract.serve import Dtype, Quantization, ServeArgs
from kernelbake.errors import SpecError
from kernelbake.validate import Source, load_yaml, quoted

_REVISION = re.compile(r"^[0-9a-f]{40}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# Same path at compile and serve time: vLLM hashes the model path.
MODEL_ROOT = "/models"


_DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSource:
    id: str
    revision: str
    path: str
    # A directory shipped with the spec (config only, random weights) instead of a hub model.
    local_dir: Path | None = None


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
    # ``snapshot: true``: the image carries CRIU (images/base/criu/criu.lock, pinned by version
    # and sha256) at /opt/kernelbake/criu, so `snapshot take` and a restore mount nothing.
    snapshot: bool = False
    # Where the spec was read, so errors found after loading (plan) name file:line: field too.
    located: Source | None = dataclasses.field(default=None, compare=False, repr=False)

    def where(self, field: str) -> str:
        return self.located.where(field) if self.located is not None else f"{self.source}: {field}"

    def base_for(self, family: str) -> str | None:
        bases = dict(self.base)
        return bases.get(family, bases.get("default"))


# -- loading -------------------------------------------------------------------------------

_TOP = {"name", "model", "engine", "serve", "compile", "targets", "base", "snapshot"}
_MODEL = {"id", "revision", "local", "path"}
_ENGINE = {"name", "version"}
# Every ServeArgs field is a serve: key, spelled the same.
_SERVE = {f.name for f in dataclasses.fields(ServeArgs)}
_SERVE_INTS = tuple(f.name for f in dataclasses.fields(ServeArgs) if f.type == "int")
_COMPILE = {"shapes"}


def _model(doc: Source, spec_dir: Path, raw: Any, name: str) -> ModelSource:
    m = doc.mapping(raw, "model", _MODEL)
    path = m.get("path")
    if path is not None and (not isinstance(path, str) or not path.startswith("/")):
        raise doc.error("model.path", f"must be an absolute path inside the image, got {quoted(path)}")
    default_path = f"{MODEL_ROOT}/{name}"
    if "local" in m:
        if "revision" in m:
            raise doc.error("model.revision", "a local model has no revision (its files are hashed)")
        local = (spec_dir / str(m["local"])).resolve()
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
            "model.id", f"expected a hub id like 'org/name' (or model.local), got {quoted(m.get('id'))}"
        )
    revision = m.get("revision")
    if not isinstance(revision, str) or not _REVISION.match(revision):
        raise doc.error("model.revision", f"must be a pinned 40-hex commit, got {quoted(revision)}")
    return ModelSource(id=m["id"], revision=revision, path=path or default_path)


def tree_digest(root: Path) -> str:
    """Content digest of a directory (relative paths and bytes), independent of mtimes."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _serve(doc: Source, raw: Any) -> ServeArgs:
    s = doc.mapping(raw if raw is not None else {}, "serve", _SERVE)
    kw: dict[str, Any] = {}
    if "dtype" in s:
        kw["dtype"] = doc.enum(Dtype, s["dtype"], "serve.dtype", aliases=_DTYPE_ALIASES, fold_case=True)
    if "quantization" in s:
        kw["quantization"] = doc.enum(Quantization, s["quantization"], "serve.quantization", fold_case=True)
    for f in _SERVE_INTS:
        if f in s:
            kw[f] = doc.positive_int(s[f], f"serve.{f}")
    ep = kw.get("expert_parallel_size", 1)
    if ep not in (1, kw.get("tensor_parallel_size", 1)):
        raise doc.error(
            "serve.expert_parallel_size",
            "must be 1 or equal tensor_parallel_size (vLLM's EP spans the TP group)",
        )
    if "compilation_config" in s:
        kw["compilation_config"] = _compilation_config(doc, s["compilation_config"])
    if "env" in s:
        kw["env"] = _serve_env(doc, s["env"])
    if "extra_args" in s:
        kw["extra_args"] = _extra_args(doc, s["extra_args"])
    return ServeArgs(**kw)


def _compilation_config(doc: Source, cc: Any) -> str:
    """The mapping as compact JSON with sorted keys: one mapping, one string."""
    if not isinstance(cc, dict):
        raise doc.error("serve.compilation_config", f"expected a mapping, got {type(cc).__name__}")
    return json.dumps(cc, sort_keys=True, separators=(",", ":"))


def _serve_env(doc: Source, env: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(env, dict):
        raise doc.error("serve.env", f"expected a mapping of VAR: value, got {type(env).__name__}")
    for k in env:
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise doc.error(f"serve.env.{k}", "not an environment variable name")
    return tuple(sorted((k, str(v)) for k, v in env.items()))


def _extra_args(doc: Source, extra: Any) -> tuple[str, ...]:
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        raise doc.error("serve.extra_args", "expected a list of strings")
    return tuple(extra)


def _compile(doc: Source, raw: Any) -> CompileOptions:
    c = doc.mapping(raw if raw is not None else {}, "compile", _COMPILE)
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
    source = Path(path)
    data, doc = load_yaml(source, what="spec", error_type=SpecError)
    if data is None:
        raise SpecError(f"{source}: the spec is empty", hint="see images/tiny-llama.yaml for one")
    top = doc.mapping(data, "", _TOP, {"name", "model", "engine", "targets"})
    name = top["name"]
    if not isinstance(name, str) or not _NAME.match(name):
        raise doc.error("name", f"must be a lowercase image name ([a-z0-9._-]), got {quoted(name)}")
    eng = doc.mapping(top["engine"], "engine", _ENGINE, {"name", "version"})
    engine = doc.enum(Engine, eng["name"], "engine.name", fold_case=True)
    version = eng["version"]
    if not isinstance(version, str) or not version:
        raise doc.error(
            "engine.version", f"expected an exact version string like '0.26.0', got {quoted(version)}"
        )
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
        source=source,
        model=_model(doc, source.parent, top["model"], name),
        engine=engine,
        engine_version=version,
        serve=_serve(doc, top.get("serve")),
        compile=_compile(doc, top.get("compile")),
        targets=tuple(t.lower() for t in targets),
        base=tuple(sorted((str(k), v) for k, v in base.items())),
        snapshot=doc.boolean(top.get("snapshot", False), "snapshot"),
        located=doc,
    )
