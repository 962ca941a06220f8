"""What each engine declares about its image, as data: the cache kinds it fills and the
variables that point it at them.

The host renders the Dockerfile from a declaration (one ``COPY`` per kind, the ``ENV``
lines) without the engine's code, and the engine's code in the image points the engine at
its caches with the same declaration, so both sides agree by construction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from kernelbake.contract.key import Engine
from kernelbake.contract.layout import CacheKind, kind_dir


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

    def cache_env(self, root: Path) -> dict[str, str]:
        """Environment variables that point the engine at the caches under ``root``."""
        return {
            name: str(kind_dir(root, value)) if isinstance(value, CacheKind) else value
            for name, value in self.cache_variables
        }


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
        ("TILELANG_CACHE_DIR", CacheKind.TILELANG),
        ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1"),
        ("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", CacheKind.CUTE_DSL),
        ("CUTE_DSL_CACHE_DIR", CacheKind.CUTE_DSL),
        *VLLM_PINNED_HASHED_ENV.items(),
    ),
)

DECLARATIONS: Mapping[Engine, EngineDeclaration] = {d.engine: d for d in (TORCH, VLLM)}
