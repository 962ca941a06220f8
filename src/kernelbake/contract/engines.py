"""What each engine declares about its image, as data: the cache kinds it fills and the
variables that point it at them.

The host renders the Dockerfile from a declaration (one ``COPY`` per kind, the ``ENV``
lines) without the engine's code, and the engine's code in the image points the engine at
its caches with the same declaration, so both sides agree by construction.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from pathlib import Path

from kernelbake.contract.key import NONE, CacheKey, Engine
from kernelbake.contract.layout import CacheKind, kind_dir


class Build(enum.Enum):
    """Which build of an engine release an image uses: the CPU wheels or the CUDA image."""

    CPU = "cpu"
    CUDA = "cuda"


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineDeclaration:
    engine: Engine
    # Cache kinds this engine may produce; each gets its own layer in the final image.
    cache_kinds: tuple[CacheKind, ...]
    # Variable → the directory of a kind under the cache root, or a fixed value.
    cache_variables: tuple[tuple[str, CacheKind | str], ...]
    # Variables the engine folds into its compile hash that are known without asking it;
    # an engine that can say so itself (vLLM) adds its own answer at compile time.
    hashed_env: tuple[str, ...] = ()
    # Fixed variables set on the engine's CPU build only (a key without CUDA).
    cpu_variables: tuple[tuple[str, str], ...] = ()
    # (release, build) → the runtime module that adapts kernelbake to it (one per release
    # line, the only code that touches the engine's internals). Image code reads it here,
    # since it never sees the catalogue; tests/vllm/test_releases.py holds engines.yaml's
    # releases and ``adapter`` to it.
    adapters: tuple[tuple[str, Build, str], ...] = ()

    def cache_env(self, root: Path, *, cpu: bool = False) -> dict[str, str]:
        """Environment variables that point the engine at the caches under ``root``; with
        ``cpu`` (see ``is_cpu_build``), also those its CPU build needs."""
        return {
            **(dict(self.cpu_variables) if cpu else {}),
            **{
                name: str(kind_dir(root, value)) if isinstance(value, CacheKind) else value
                for name, value in self.cache_variables
            },
        }

    def cache_env_for(self, root: Path, key: CacheKey) -> dict[str, str]:
        """``cache_env`` for the image built for ``key``: its CPU build's variables too where
        the key records no CUDA."""
        return self.cache_env(root, cpu=is_cpu_build(key))

    def adapter(self, version: str, build: Build) -> str:
        """The adapter module for that build of ``version``; ``none`` for one kernelbake has
        not listed."""
        return next((m for v, b, m in self.adapters if (v, b) == (version, build)), NONE)

    def nearest_adapted(self, version: str, build: Build) -> str:
        """The release with an adapter for ``build`` nearest to ``version`` (``nearest_release``)."""
        return nearest_release(version, [v for v, b, _m in self.adapters if b is build])

    def adapted(self) -> str:
        """``0.26.0 (cuda), 0.32.0 (cpu, cuda)``: the releases and builds with an adapter."""
        builds: dict[str, list[str]] = {}
        for v, b, _m in self.adapters:
            builds.setdefault(v, []).append(b.value)
        return ", ".join(f"{v} ({', '.join(bs)})" for v, bs in builds.items())


def _release_numbers(version: str) -> tuple[int, ...]:
    parts = [int(p) if p.isdigit() else 0 for p in version.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def nearest_release(version: str, listed: Iterable[str]) -> str:
    """Of ``listed``, the release nearest ``version`` (``none`` for an empty list): of the
    listed neighbours below and above it, the one whose major, then minor, then patch number is
    closer; on a tie the older, since a pin moved down keeps to what was out when the user's
    release was chosen. Not a number (``main``): read as 0."""
    want = _release_numbers(version)
    ordered = sorted(set(listed), key=_release_numbers)
    below = [v for v in ordered if _release_numbers(v) <= want]
    above = [v for v in ordered if _release_numbers(v) > want]
    if not below or not above:
        return (below[-1:] or above[:1] or [NONE])[0]

    def distance(candidate: str) -> tuple[int, ...]:
        return tuple(abs(g - w) for g, w in zip(_release_numbers(candidate), want, strict=True))

    return below[-1] if distance(below[-1]) <= distance(above[0]) else above[0]


def is_cpu_build(key: CacheKey) -> bool:
    """Whether the image's engine is its CPU build: the key records no CUDA."""
    return key.cuda == NONE


TORCH = EngineDeclaration(
    engine=Engine.TORCH,
    cache_kinds=(CacheKind.INDUCTOR, CacheKind.TRITON),
    cache_variables=(
        ("TORCHINDUCTOR_CACHE_DIR", CacheKind.INDUCTOR),
        ("TRITON_CACHE_DIR", CacheKind.TRITON),
        ("TORCHINDUCTOR_FX_GRAPH_CACHE", "1"),
        ("TORCHINDUCTOR_AUTOGRAD_CACHE", "1"),
        # Precompiled headers live in $TMPDIR/torchinductor_<user>, outside the cache
        # dir, and are rebuilt (~6 s of g++) on every cache hit; without them a hit
        # needs no compiler at all.
        ("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0"),
    ),
    # Inductor folds its config into the FX-graph cache key; these come from the environment.
    hashed_env=(
        "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS",
        "TORCHINDUCTOR_FREEZING",
        "TORCHINDUCTOR_MAX_AUTOTUNE",
        "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM",
        "TORCHINDUCTOR_CPP_WRAPPER",
        "TORCHINDUCTOR_FORCE_DISABLE_CACHES",
    ),
)

# Hashed vLLM variables whose *default* depends on the process, not the image: left unset,
# a serving pod with another HOME (runAsUser) computes another compile hash and never finds
# the baked graphs (measured on vLLM 0.26: HOME alone forced a full recompile). Defaults that
# follow the CPU count (VLLM_MAX_AUDIO_PREPROCESS_WORKERS) are in vLLM's ignored_factors.
# Pinned to constants, the same at build and serve time and independent of where the bundle
# lives, so the torch.compile part stays relocatable. None of them changes generated code.
VLLM_PINNED_HASHED_ENV = {
    "VLLM_CONFIG_ROOT": "/opt/kernelbake/vllm-config",
    "VLLM_XLA_CACHE_PATH": "/opt/kernelbake/xla-cache",
}

# vLLM's CPU build (0.32): its AOT artifact is written but never reloads ("Compiling model
# again due to a load failure … 'function' object has no attribute 'finalize_loading'"), so a
# baked start would recompile. Without AOT compile, Inductor's FX-graph cache under
# TORCHINDUCTOR_CACHE_DIR is used and hits, also relocated. Inductor keys that cache on
# whether C++ headers are precompiled; the precompiled header (149 MB) lives under $TMPDIR,
# outside the bundle, so it is off at build and serve alike. Both are in the image's ENV and
# set identically at compile and serve time, and vLLM hashes the first (manifest hashed_env).
VLLM_CPU_PINNED_ENV = {
    "VLLM_USE_AOT_COMPILE": "0",
    "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0",
}

# Where vLLM and each library it uses keeps its JIT cache. vLLM's hashed variables are not
# listed: the compile step asks vLLM for them (``compile_factors``).
VLLM = EngineDeclaration(
    engine=Engine.VLLM,
    cache_kinds=(
        CacheKind.VLLM,
        CacheKind.TRITON,
        CacheKind.INDUCTOR,
        CacheKind.FLASHINFER,
        CacheKind.DEEPGEMM,
        CacheKind.TILELANG,
        CacheKind.CUTE_DSL,
        CacheKind.TRTLLM_DEEPGEMM,
    ),
    cache_variables=(
        # torch.compile artifacts (AOT + Inductor) and FlashInfer's autotune results.
        ("VLLM_CACHE_ROOT", CacheKind.VLLM),
        ("TRITON_CACHE_DIR", CacheKind.TRITON),
        # torch.compile outside the model (vLLM sets its own per-model Inductor dir).
        ("TORCHINDUCTOR_CACHE_DIR", CacheKind.INDUCTOR),
        # JIT modules and downloaded cubins; not relocatable (absolute paths in build.ninja).
        ("FLASHINFER_WORKSPACE_BASE", CacheKind.FLASHINFER),
        ("DG_JIT_CACHE_DIR", CacheKind.DEEPGEMM),
        # FlashInfer's copy of TensorRT-LLM's DeepGEMM (vLLM 0.26 picks it for FP8 block-
        # quantised linear layers on Hopper) nvcc-compiles one kernel per GEMM shape at every
        # start into $HOME/.tensorrt_llm/cache unless this points elsewhere; files are named
        # by shape only, so the directory relocates.
        ("TRTLLM_DG_CACHE_DIR", CacheKind.TRTLLM_DEEPGEMM),
        ("TILELANG_CACHE_DIR", CacheKind.TILELANG),
        ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1"),
        ("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", CacheKind.CUTE_DSL),
        ("CUTE_DSL_CACHE_DIR", CacheKind.CUTE_DSL),
        *VLLM_PINNED_HASHED_ENV.items(),
    ),
    cpu_variables=tuple(VLLM_CPU_PINNED_ENV.items()),
    adapters=(
        ("0.26.0", Build.CUDA, "kernelbake.runtime.engines.vllm._v0_26"),
        ("0.32.0", Build.CPU, "kernelbake.runtime.engines.vllm._v0_32"),
        ("0.32.0", Build.CUDA, "kernelbake.runtime.engines.vllm._v0_32"),
        ("0.34.0", Build.CUDA, "kernelbake.runtime.engines.vllm._v0_34"),
    ),
)

DECLARATIONS: Mapping[Engine, EngineDeclaration] = {d.engine: d for d in (TORCH, VLLM)}
