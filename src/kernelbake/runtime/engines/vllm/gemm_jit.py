"""What the two DeepGEMM JITs vLLM runs key their kernels on, for ``identity`` (the
``deepgemm`` and ``trtllm-deepgemm`` cache kinds): without these, ``check`` answered
``unknown`` for every image that baked either (the FP8 MoE, 2026-12-06).

Neither library has a function that names a kernel's cache entry without compiling it, so
what is recorded are the inputs their names are made from, found where the library finds them:

- DeepGEMM (``DG_JIT_CACHE_DIR``): vLLM imports an installed ``deep_gemm`` first, else the copy
  it vendors (``vllm.utils.deep_gemm._import_deep_gemm``). DeepGEMM's JIT names each kernel by
  a digest of the library's version (itself a digest of its include files), the compiler,
  the flags and the generated source, which holds the GEMM's shape and the device's SM count.
  Recorded: the package's files, the nvcc it runs, its ``DG_*`` variables and the device.
- TensorRT-LLM's DeepGEMM inside FlashInfer (``TRTLLM_DG_CACHE_DIR``): names each kernel by its
  GEMM shape alone (its ``compiler.cuh``), so it loads a baked kernel whatever compiled it.
  Recorded: its sources and ``TRTLLM_DG_*`` variables, so that ``check`` can say when the
  kernels it would load were compiled from other sources.

The package files are hashed by content (some 64 MB for vLLM 0.32's DeepGEMM, about 0.2 s on a
2-core host): a derived image that installs another DeepGEMM shows as a change.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernelbake.contract.layout import CacheKind

DEEPGEMM = CacheKind.DEEPGEMM.value
TRTLLM_DEEPGEMM = CacheKind.TRTLLM_DEEPGEMM.value
KINDS = (DEEPGEMM, TRTLLM_DEEPGEMM)
# Where the variables only say where the cache is: the names in it do not depend on them.
_LOCATIONS = frozenset({"DG_JIT_CACHE_DIR", "TRTLLM_DG_CACHE_DIR"})
# In the order vLLM tries them.
_DEEPGEMM_PACKAGES = ("deep_gemm", "vllm.third_party.deep_gemm")
# FlashInfer's copy, below its package.
_TRTLLM_SOURCES = Path("data/csrc/nv_internal/tensorrt_llm/deep_gemm")


def facts(env: Mapping[str, str], device: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Both libraries' facts, by cache kind."""
    return {DEEPGEMM: deepgemm(env, device), TRTLLM_DEEPGEMM: trtllm_deepgemm(env)}


def deepgemm(env: Mapping[str, str], device: Mapping[str, Any]) -> dict[str, Any]:
    """DeepGEMM's facts; ``device``: the name and SM count of the device it compiles for."""
    found = next(((name, root) for name in _DEEPGEMM_PACKAGES if (root := _package(name))), None)
    if found is None:
        return {"installed": False}
    name, root = found
    return {
        "package": name,
        "files": tree_digest(root),
        "nvcc": _file_digest(_nvcc(env)),
        "env": variables(env, "DG_"),
        "device": dict(device),
    }


def trtllm_deepgemm(env: Mapping[str, str]) -> dict[str, Any]:
    root = _package("flashinfer")
    if root is None or not (root / _TRTLLM_SOURCES).is_dir():
        return {"installed": False}
    return {"sources": tree_digest(root / _TRTLLM_SOURCES), "env": variables(env, "TRTLLM_DG_")}


def variables(env: Mapping[str, str], prefix: str) -> dict[str, str]:
    """The library's own variables (values digested: they are not secret-named, but nothing
    here needs them in clear), without those that only place its cache."""
    return {
        k: hashlib.sha256(v.encode()).hexdigest()[:16]
        for k, v in sorted(env.items())
        if k.startswith(prefix) and k not in _LOCATIONS
    }


def tree_digest(root: Path) -> str:
    """sha256 over every file below ``root`` by relative path and content, bytecode left out
    (an import may write it at serve time into an image built without it)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def _package(name: str) -> Path | None:
    """A package's directory without importing it (DeepGEMM's import loads its CUDA extension)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _nvcc(env: Mapping[str, str]) -> Path | None:
    """The nvcc DeepGEMM runs: its variable, else ``$CUDA_HOME/bin/nvcc``, else the PATH's."""
    if chosen := env.get("DG_JIT_NVCC_COMPILER"):
        return Path(chosen)
    for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH")):
        if home and (Path(home) / "bin/nvcc").is_file():
            return Path(home) / "bin/nvcc"
    found = shutil.which("nvcc", path=env.get("PATH"))
    return Path(found) if found else None


def _file_digest(path: Path | None) -> str:
    if path is None:
        return "missing"
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "missing"
