"""The ``torch`` engine: plain ``torch.compile`` (Inductor) of a transformers model.

Runs on the CPU in CI. The compile stage builds the model from its config with random
weights, compiles it on the spec's shapes and stops; the caches it leaves behind in
``TORCHINDUCTOR_CACHE_DIR`` (FX graphs, AOTAutograd entries, compiled C++ kernels) and
``TRITON_CACHE_DIR`` are the bundle. torch is imported inside methods only.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kernelbake.key import NONE, Engine
from kernelbake.runtime import probe
from kernelbake.runtime.bundle import CacheKind, kind_dir
from kernelbake.runtime.config import TargetConfig
from kernelbake.runtime.engines import CompileResult, Facts

if TYPE_CHECKING:
    from kernelbake.runtime.preflight import Verdict

# Options of torch_serve that change what gets compiled.
_SHAPE_OPTIONS = ("--shapes",)

# Inductor folds its config into the FX-graph cache key; these come from the environment.
_HASHED_ENV = (
    "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS",
    "TORCHINDUCTOR_FREEZING",
    "TORCHINDUCTOR_MAX_AUTOTUNE",
    "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM",
    "TORCHINDUCTOR_CPP_WRAPPER",
    "TORCHINDUCTOR_FORCE_DISABLE_CACHES",
)


class TorchEngine:
    engine: Engine = Engine.TORCH
    cache_kinds: tuple[CacheKind, ...] = (CacheKind.INDUCTOR, CacheKind.TRITON)

    def probe(self) -> Facts:
        import torch

        version = probe.public_version(torch.__version__)
        if torch.cuda.is_available():
            device = str(torch.cuda.get_device_name(0))
            capability = tuple(torch.cuda.get_device_capability(0))
            arch = probe.gpu_arch(device, (int(capability[0]), int(capability[1])))
            driver = probe.nvidia_driver()
        else:
            device, arch, driver = "cpu", probe.machine(), NONE
        return Facts(
            engine_version=version,
            torch=version,
            triton=probe.dist_version("triton"),
            cuda=str(torch.version.cuda) if torch.version.cuda else NONE,
            flashinfer=NONE,
            python=probe.python_version(),
            arch=arch,
            device=device,
            driver=driver,
        )

    def cache_env(self, root: Path) -> dict[str, str]:
        return {
            "TORCHINDUCTOR_CACHE_DIR": str(kind_dir(root, CacheKind.INDUCTOR)),
            "TRITON_CACHE_DIR": str(kind_dir(root, CacheKind.TRITON)),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
            # Precompiled headers live in $TMPDIR/torchinductor_<user>, outside the cache
            # dir, and are rebuilt (~6 s of g++) on every cache hit; without them a hit
            # needs no compiler at all.
            "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0",
        }

    def hashed_env_names(self) -> tuple[str, ...]:
        return _HASHED_ENV

    def compile(self, target: TargetConfig, root: Path) -> CompileResult:
        from kernelbake.runtime.engines.torch_model import load_and_warm

        _model, report = load_and_warm(target)
        # The compile step records the hashed variables' values itself, from its environment.
        return CompileResult(kinds=self.cache_kinds, hashed_env={}, report={"warmup": report.to_json()})

    def serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        return [
            sys.executable,
            "-m",
            "kernelbake.runtime.engines.torch_serve",
            *target.serve.extra_args,
            *user_args,
        ]

    def predict(self, target: TargetConfig, user_args: Sequence[str], env: Mapping[str, str]) -> None:
        # Inductor's own key needs the traced graph; the shapes check (shape_args) stands in.
        return None

    def prediction_env(self, baked_root: Path) -> dict[str, str]:
        return {}

    def serve_watcher(self, cache_root: Path) -> None:
        # The torch serve helper reports Inductor's own hit counters itself.
        return None

    def shape_args(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        return [
            f"{a} changes the warmed-up input shapes"
            for a in user_args
            if a.split("=", 1)[0] in _SHAPE_OPTIONS
        ]


def use_baked_caches(user_args: Sequence[str] = ()) -> Verdict:
    """For your own scripts in a torch image: run the preflight and point this process at the
    caches it chose (the baked ones when they fit, else a fresh directory), so that your own
    ``torch.compile`` of the same model and shapes loads the baked graphs and kernels.

    Call it before importing torch: Inductor reads some of these variables at import.
    """
    from kernelbake.runtime import env as runtime_env
    from kernelbake.runtime.env import RuntimeEnv
    from kernelbake.runtime.preflight import preflight

    verdict = preflight(RuntimeEnv.from_env(), user_args, engine=TorchEngine())
    for line in verdict.lines():
        print(f"kernelbake: {line}", file=sys.stderr, flush=True)
    runtime_env.apply(verdict.env)
    return verdict
