"""The ``vllm`` engine: compile-only with fake weights at build time, plain ``vllm serve`` at
run time, with every JIT cache vLLM and its libraries fill pointed into the bundle."""

from __future__ import annotations

import importlib.metadata
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.contract.engines import VLLM, EngineDeclaration, is_cpu_build
from kernelbake.contract.layout import MANIFEST, kind_dir
from kernelbake.contract.platform import Platform, Software
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BuildFailed
from kernelbake.runner import Runner, run
from kernelbake.runtime import probe
from kernelbake.runtime.engines import CompileResult
from kernelbake.runtime.engines.vllm import args as vargs
from kernelbake.runtime.engines.vllm import compat_layer, evidence, ranks
from kernelbake.runtime.engines.vllm import shm as vshm
from kernelbake.runtime.engines.vllm.plugin import BAKED_MANIFEST_ENV, WEIGHTS_ENV, WeightsMode
from kernelbake.runtime.prediction import Prediction
from kernelbake.runtime.shm import ShmNeed

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
    "request_warmup",
    "weights_reason",
    "vllm_config_hash",
    "weights_mode",
    "lent_bytes",
    "allocated_after_load_bytes",
    # vLLM's own cache identity (engines.vllm.identity), the baseline of every prediction.
    "engine_identity",
    "engine_identity_error",
)


PLUGIN_TARGET = "kernelbake.runtime.engines.vllm.plugin:register"

# ``vllm serve`` sets spawn for its engine-core process unless this is set, and a spawned
# engine core imports torch and vLLM all over again (~11 s of a 40 s baked start on an H200,
# bench/results/vllm-0.26.0-h200-warmstart/). Forked, it inherits the API server's imports.
# Safe where vLLM itself says so: its get_mp_context() turns fork back into spawn when CUDA
# is already initialised in the parent (the API server never initialises it; kernelbake's
# plugin there only waits at the cache gate), in a Ray actor, under WSL or --numa-bind.
# vLLM 0.26 leaves the variable out of its compile hash (envs.compile_factors'
# ignored_factors), so the baked caches still match.
LAUNCH_ENV = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}

# But not for a tree ``snapshot take`` dumps. A forked engine core inherits the API server's
# NVML file descriptors (/dev/nvidiactl, /dev/nvidia0, /dev/nvidia-caps/*: torch's device count
# initialises NVML in the API server and never shuts it down). The driver's checkpoint closes a
# process's own CUDA and NVML files, not inherited ones, and NVML in the child no longer owns
# them, so they stayed open and CRIU cannot dump a device file: vLLM 0.32 on the H100, and
# reproduced with a forked torch process and no vLLM
# (bench/results/vllm-0.32.0-h100-snapshot-2026-12-06-fifth/). Spawned, the engine core
# starts with none. vLLM 0.26 and 0.32 both leave the variable out of their compile hash
# (envs.compile_factors' ignored_factors); the seconds a spawned engine core takes to import
# again are the take's, never the restore's.
# And the addresses the tree's sockets listen on: vLLM's own (VLLM_HOST_IP) and gloo's (torch
# .distributed's CPU group: 13 listening sockets in the default image) are by default the
# container's IP, which CRIU gives back to the restored sockets, and a pod or container with
# another IP cannot bind them ("Can't bind inet socket: Cannot assign requested address", the
# default image under podman, 2026-12-06). Loopback is the same in every container. None of
# them is in vLLM's compile hash, asked of vLLM itself in tests/integration/
# test_vllm_cpu_image.py (envs.compile_factors with and without them). NCCL's bootstrap
# (NCCL_SOCKET_IFNAME, tensor parallelism) is not set: not measured on a GPU yet.
SNAPSHOT_ENV = {
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "VLLM_HOST_IP": "127.0.0.1",
    "GLOO_SOCKET_IFNAME": "lo",
}

# vLLM 0.26's start-up plan (vllm/v1/worker/startup_plan.py): with this set to 1, a worker
# that profiled memory saves the KV-cache size it found under VLLM_CACHE_ROOT/startup_plan/,
# and every later boot with the same config and device applies it without profiling. Profiled
# by compile-only, under fake weights, that size leaves out the weights' memory: baked into
# the bundle, every start would size its KV cache for a GPU without the model on it. So it is
# off for compile-only whatever the image's environment says. vLLM leaves the variable out of
# its compile hash (envs.compile_factors' ignored_factors): forcing it changes no key.
STARTUP_PLAN_ENV = "VLLM_ENABLE_STARTUP_PLAN"

# FlashInfer (0.6.14, flashinfer/jit/core.py) appends to this file in its workspace on every
# process start. In the manifest, a second start on the same cache root (a restarted container,
# a seeded volume) found it grown and started cold: seen on the H200. Nothing reads it back.
APPENDED_LOGS = frozenset({"flashinfer_jit.log"})


def plugin_will_run(environ: Mapping[str, str]) -> bool:
    """Whether vLLM, started with ``environ``, will call our plugin (which holds the cache
    gate). Asked of the same entry-point table vLLM reads, and the plugin is loaded here
    the way vLLM loads it; ``VLLM_PLUGINS`` is vLLM's allow-list (unset: all plugins),
    mirrored because importing vLLM to ask would take the seconds the gate is there to save."""
    ours = [
        ep
        for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
        if ep.value == PLUGIN_TARGET
    ]
    allowed = environ.get("VLLM_PLUGINS")
    if not ours or (allowed is not None and ours[0].name not in allowed.split(",")):
        return False
    try:
        ours[0].load()
    except Exception:
        return False
    return True


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
    declaration: EngineDeclaration = VLLM

    def __init__(self, runner: Runner = run) -> None:
        self._run = runner

    def probe(self) -> Platform:
        if compat_layer.installed_is_cpu_build():
            # The catalogue's cpu target: device "cpu", arch the machine's.
            device, arch, cuda = CPU_DEVICE, probe.machine(), probe.torch_cuda()
        else:
            device, arch, cuda = probe.cuda_device(self._run)
        software = Software(
            engine_version=compat_layer.installed_vllm()[1],
            torch=probe.dist_version("torch"),
            triton=probe.dist_version("triton"),
            cuda=cuda,
            flashinfer=probe.dist_version("flashinfer-python"),
            python=probe.python_version(),
        )
        return Platform(software=software, arch=arch, device=device, driver=probe.nvidia_driver())

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
        env.update(self.declaration.cache_env_for(root, target.key))
        env[STARTUP_PLAN_ENV] = "0"
        for kind in self.declaration.cache_kinds:
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
        report = self._compile_only(target, env, log, WeightsMode.AUTO)
        if report is None and compat_layer.installed_is_cpu_build():
            # The CPU build runs vLLM's dummy weights (_v0_32): no other weights mode to try.
            raise BuildFailed("vLLM compile-only (CPU build, dummy weights) failed", hint=f"see {log}")
        if report is None:
            print(
                f"kernelbake: compile-only with fake (or dummy) weights failed (see {log}); retrying with uninitialised "
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
        kept = {k: report[k] for k in _REPORT_KEYS if k in report}
        # One answer per worker (compile_only asks each); a world above 1 must have them all.
        answers = report.get("ranks", [])
        world = target.serve.tensor_parallel_size * target.serve.pipeline_parallel_size
        # The CPU build keeps no per-rank artifacts (AOT compile is off there, and Inductor's
        # cache is shared), so it records no rank entries: entries of 0 files would read as
        # "rank 0 was never compiled" at serve time. A CPU world above 1 (not validated) then
        # starts cold, as any bundle without its ranks does.
        per_rank = not is_cpu_build(target.key) and (bool(answers) or world > 1)
        entries = ranks.rank_entries(root, answers, world) if per_rank else ()
        if answers:
            kept["ranks"] = ranks.rank_facts(answers)
        return CompileResult(
            kinds=self.declaration.cache_kinds,
            hashed_env=hashed,
            report=kept,
            ranks=entries,
            logs=APPENDED_LOGS,
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
            report: dict[str, Any] = jsondoc.loads(report_path.read_text())
            return report

    def _vllm_serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        """``vllm serve MODEL flags…``. The Inductor options the build pinned (recorded in the
        baked manifest) are set the same way here, so vLLM's logging level does not change
        the compile hash."""
        from kernelbake.runtime.engines.vllm.predict import baked_identity

        identity = baked_identity(Path(target.cache_root) / MANIFEST)[0] or {}
        pins = identity.get("pins") if isinstance(identity.get("pins"), dict) else None
        return vargs.serve_argv(target.key.model_path, target.serve, user_args, pins)

    def serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        argv = self._vllm_serve_argv(target, user_args)
        if compat_layer.installed_is_cpu_build():
            # `vllm serve` looks up the distribution "vllm" for --version and fails on
            # vllm-cpu (PackageNotFoundError); the API server module is the same server and
            # parser. The model goes in --model: that parser takes no positional model.
            return [sys.executable, "-m", CPU_SERVER_MODULE, "--model", *argv[2:]]
        return argv

    def holds_at_gate(self, environ: Mapping[str, str]) -> bool:
        return plugin_will_run(environ)

    def shm_need(
        self, target: TargetConfig, user_args: Sequence[str], environ: Mapping[str, str]
    ) -> ShmNeed | None:
        return vshm.shm_need(
            target.serve,
            user_args,
            environ,
            cpu_build=compat_layer.installed_is_cpu_build(),
            root=vshm.vllm_root(),
        )

    def launch_env(self) -> dict[str, str]:
        return dict(LAUNCH_ENV)

    def snapshot_env(self) -> dict[str, str]:
        return dict(SNAPSHOT_ENV)

    def serve_watcher(self, cache_root: Path) -> Callable[[str], str | None]:
        dirs = evidence.cache_dirs(cache_root, self.declaration.cache_kinds)
        return evidence.watcher(dirs, evidence.manifest_digests(cache_root, dirs))

    def shape_args(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        # The fallback only: a bundle without vLLM's identity (built by an older kernelbake).
        return vargs.shape_overrides(user_args, target.serve)

    def prediction_env(self, baked_root: Path) -> dict[str, str]:
        """Makes the plugin in vLLM's API server log its own per-kind verdict."""
        return {BAKED_MANIFEST_ENV: str(baked_root / MANIFEST)}

    def predict(
        self, target: TargetConfig, user_args: Sequence[str], env: Mapping[str, str]
    ) -> Prediction | None:
        """vLLM's own verdict, in this process, with exactly the environment ``serve`` gives
        vLLM (set here before vLLM reads it). ``None`` when vLLM cannot be imported."""
        import os

        from kernelbake.runtime.engines.vllm.predict import baked_identity

        manifest = Path(target.cache_root) / MANIFEST
        if baked_identity(manifest)[0] is None:
            return None
        from kernelbake.runtime.redact import RedactingStream, Redactor

        os.environ.clear()
        os.environ.update({k: v for k, v in env.items() if k != BAKED_MANIFEST_ENV})
        # vLLM logs from this process from here on, to stdout by default: that goes to stderr
        # (check's stdout is its verdict), with secrets in what vLLM echoes as digests.
        redactor = Redactor.for_run(env, user_args)
        stdout, stderr = sys.stdout, sys.stderr
        sys.stdout = RedactingStream(stderr, redactor)
        sys.stderr = RedactingStream(stderr, redactor)
        try:
            from kernelbake.runtime.engines.vllm.predict import check

            return check(self._vllm_serve_argv(target, user_args)[2:], manifest)
        except ImportError:
            return None
        finally:
            sys.stdout, sys.stderr = stdout, stderr


__all__ = [
    "APPENDED_LOGS",
    "CPU_SERVER_MODULE",
    "LAUNCH_ENV",
    "PLUGIN_TARGET",
    "SNAPSHOT_ENV",
    "STARTUP_PLAN_ENV",
    "VllmEngine",
    "compile_argv",
    "plugin_will_run",
]
