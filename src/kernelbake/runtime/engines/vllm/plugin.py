"""``vllm.general_plugins`` entry point. vLLM calls it in every process it starts (engine
core, each tensor-parallel worker), which is how compile-only reaches workers that kernelbake
does not start itself. At serve time it holds the cache gate and then, in the API server,
states vLLM's own prediction of its cache hits (``predict.serve_hook``); serving is plain vLLM.

vLLM 0.26 loads general plugins before anything opens a cache: in the API server from
``AsyncEngineArgs.add_cli_args`` (building the ``vllm serve`` parser) and
``EngineArgs.__post_init__``, both before any config exists and so before the model-info
cache under ``VLLM_CACHE_ROOT/modelinfos`` is read; in the engine core before its executor;
in each worker before it loads the model. The module imports nothing heavy: vLLM logs and
skips a plugin whose import fails, and then nothing would hold the gate. The gate is held
first, so the prediction (which reads the baked manifest) runs only once the caches are verified."""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Any

COMPILE_ONLY_ENV = "KERNELBAKE_COMPILE_ONLY"
WEIGHTS_ENV = "KERNELBAKE_VLLM_WEIGHTS"
# Set by ``kernelbake serve``: the baked manifest to predict cache hits against.
BAKED_MANIFEST_ENV = "KERNELBAKE_BAKED_MANIFEST"


class WeightsMode(enum.Enum):
    # FAKE, unless vLLM says the model is MoE or quantized: then DUMMY (the default).
    AUTO = "auto"
    # FakeTensors: no weight memory at all.
    FAKE = "fake"
    # vLLM's own dummy weights on the GPU, and the real forward: MoE and quantized layers
    # call JIT-compiled kernels (fused-MoE Triton kernels, DeepGEMM, FP8 quantisation) that
    # only run, and so only compile, on real tensors. Needs the weights' memory.
    DUMMY = "dummy"
    # Uninitialised GPU tensors: for models whose weight post-processing cannot run on the
    # meta device (some quantized kernels repack weights with CUDA ops). Needs the weights'
    # memory, still never reads them.
    EMPTY = "empty"


# Filled by the patches; read by the compile-only driver in the same process.
REPORT: dict[str, Any] = {}


def register() -> None:
    from kernelbake.runtime.env import GATE_ENV, MISS_NOTES_ENV, SNAPSHOT_TAKE_ENV

    if os.environ.get(GATE_ENV):
        from kernelbake.runtime import gate

        gate.hold_or_exit()
    if os.environ.get(SNAPSHOT_TAKE_ENV) == "1":
        # A process a snapshot will hold: NVML's device files closed when take asks.
        from kernelbake.runtime import nvml

        nvml.install()
    if os.environ.get(COMPILE_ONLY_ENV) != "1":
        if manifest := os.environ.get(BAKED_MANIFEST_ENV):
            # Serving: the API server says, per cache kind, what vLLM will find, as soon as it
            # has built its config (kernelbake.runtime.engines.vllm.predict).
            from kernelbake.runtime.engines.vllm.predict import serve_hook

            serve_hook(Path(manifest))
            _preload_first_launches()
        if notes := os.environ.get(MISS_NOTES_ENV):
            _note_misses(Path(notes))
        return
    from kernelbake.runtime.engines.vllm.compat_layer import patches_for_installed_vllm

    patches_for_installed_vllm().install(REPORT)
    # The request warm-up runs after vLLM's own: what it first launches is recorded.
    from kernelbake.runtime.engines.vllm import launches

    REPORT["triton_first_launches_recorded"] = launches.install(launches.Mode.RECORD)


def _preload_first_launches() -> None:
    """In the process that will run the model (the engine core forks from this one and
    inherits the wrapper; a spawned worker calls ``register`` itself), the kernels the
    build's request warm-up first launched are loaded before vLLM starts its JIT monitor."""
    from kernelbake.runtime.engines.vllm import launches

    found = launches.record_at_serve()
    if found is not None:
        try:
            launches.install(launches.Mode.PRELOAD, lambda: found)
        except launches.MonitorMissing as exc:
            # Serving goes on (each kernel then loads on its first request, as in plain vLLM),
            # but not silently. At build the same error fails the compile (``register``).
            import sys

            print(f"kernelbake: WARNING: {exc}", file=sys.stderr, flush=True)


def _note_misses(notes: Path) -> None:
    """In every serving process: its compilers and vLLM's scheduler hooked once each is
    imported (``misses``), so that the scheduler notes the batches during which the engine
    compiled. Serving never depends on it: what fails is said."""
    import sys

    from kernelbake.runtime.engines.vllm import misses

    try:
        from kernelbake.runtime.engines.vllm.compat_layer import lookups

        misses.install(notes, lookups().scheduler)
    except Exception as exc:
        print(
            f"kernelbake: WARNING: the request classes that compile are not noted ({type(exc).__name__}: {exc})",
            file=sys.stderr,
            flush=True,
        )
