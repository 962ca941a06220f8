"""The vLLM compile-only run, in a process of its own so that the cache environment is set
before torch or vLLM is imported and GPU memory can be measured for this run alone.

    python -m kernelbake.runtime.engines.vllm.compile_only --report R.json -- <vllm serve flags>

It starts vLLM in-process exactly as ``vllm serve`` would configure it (the same parser,
the same usage context), with the weights faked on a GPU (``_v0_26``) and vLLM's dummy
weights on the CPU build (``_v0_32``), then stops. Every cache
vLLM and its libraries fill during start-up lands in the directories the caller chose.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelbake.contract.manifest import UNSET
from kernelbake.runtime import redact
from kernelbake.runtime.engines.vllm.plugin import COMPILE_ONLY_ENV

# Enough for the warm-up batch (max_num_seqs requests of one block each, plus the null
# block): the warm-up then runs the batch size a real start runs, so Triton specialises its
# kernels the same way.
_EXTRA_BLOCKS = 1
# The request warm-up (``warmup``) also sends prompts near max_model_len: room for two of
# them, in blocks of vLLM's smallest size on the GPU.
_MIN_BLOCK_TOKENS = 16
# The CPU backend reserves a fraction of the host's memory unless given a KV size; the
# warm-up batch needs little (not in the hash either).
_CPU_KV_BYTES = 256 << 20


def hashed_env() -> dict[str, str]:
    """Every variable vLLM folds into its compile hash, as set in this process (``UNSET`` if
    not). Defaults that depend on the process (HOME, CPU count) are pinned by the engine's
    cache env, so comparing what is set is enough to spot a change at serve time."""
    from kernelbake.runtime.engines.vllm.compat_layer import lookups

    return {
        name: redact.shown(name, os.environ.get(name, UNSET))
        for name in sorted(lookups().env_compile_factors())
    }


def _bake_extra_jit() -> list[str]:
    """JIT modules a first request needs that start-up may not have built."""
    built: list[str] = []
    try:
        import flashinfer.sampling
    except ImportError:
        return built
    flashinfer.sampling.get_sampling_module()
    built.append("flashinfer.sampling")
    return built


def _warm_requests(engine: Any) -> dict[str, Any]:
    """Serves the request classes of ``warmup`` once, so what their first request compiles
    (sampler variants, prompt logprobs, chunked prefill, every batch size) is in the bundle."""
    from kernelbake.runtime.engines.vllm import warmup

    config = engine.vllm_config
    vocab = int(config.model_config.get_vocab_size())
    waves = warmup.plan(
        max_model_len=int(config.model_config.max_model_len),
        max_num_seqs=int(config.scheduler_config.max_num_seqs),
        max_num_batched_tokens=int(config.scheduler_config.max_num_batched_tokens),
        vocab=vocab,
    )
    started = time.monotonic()
    done = warmup.serve(engine, waves, vocab)
    return {**done, "wall_s": round(time.monotonic() - started, 2)}


def run(serve_argv: Sequence[str]) -> dict[str, Any]:
    os.environ[COMPILE_ONLY_ENV] = "1"
    # In-process engine core: the patches and the memory counters live in this process.
    # vLLM leaves this variable out of its compile hash.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    started = time.monotonic()

    import torch

    from kernelbake.runtime.engines.vllm import compat_layer, plugin, ranks

    plugin.register()
    report = plugin.REPORT
    adapter = compat_layer.patches_for_installed_vllm()
    cpu = compat_layer.installed_is_cpu_build()
    vllm = compat_layer.lookups()
    # The CPU build compiles with stock Inductor, whose own cache is what it bakes there.
    if not cpu and not vllm.aot_compile_enabled():
        raise SystemExit(
            "kernelbake compile-only needs vLLM's AOT compile (VLLM_USE_AOT_COMPILE=1, torch>=2.10)"
        )

    from kernelbake.runtime.engines.vllm import identity, predict
    from kernelbake.runtime.engines.vllm.args import with_pins

    # As this process was given them, which is what a serving process is given: vLLM's
    # platforms set some themselves during start-up (the CPU platform sets
    # VLLM_DISABLE_SHARED_EXPERTS_STREAM and VLLM_SSM_CONV_STATE_LAYOUT) and do so again
    # at serve time, so recording them afterwards would flag a difference that is not one.
    given_env = hashed_env()
    # vLLM derives some Inductor options from its logging level; fixed as flags here and at
    # serve time (from the manifest), VLLM_LOGGING_LEVEL=DEBUG keeps the compile hash.
    pins = identity.log_level_pins()
    engine_args = adapter.parse_serve_argv(with_pins(serve_argv, pins))
    # None of these enter vLLM's compile hash; they keep the build small.
    engine_args.load_format = adapter.load_format()
    engine_args.gpu_memory_utilization = 0.05
    engine_args.kv_cache_memory_bytes = _CPU_KV_BYTES if cpu else 1 << 30
    if not cpu:
        # The GPU adapter skips vLLM's KV admission check; the CPU build keeps it, and the
        # KV size above holds max_model_len.
        long_prompt_blocks = 2 * -(-int(engine_args.max_model_len or 0) // _MIN_BLOCK_TOKENS)
        engine_args.num_gpu_blocks_override = (
            int(engine_args.max_num_seqs or 256) + _EXTRA_BLOCKS + long_prompt_blocks
        )

    engine_class, usage = vllm.engine_class(), vllm.api_server_usage()
    # vLLM's own cache identity, recorded where serve computes it (after the config is built).
    predict.record_at_build(report, pins)
    # No CUDA call in this process before the engine exists: at TP/PP > 1 the workers are
    # other processes, and a CUDA context here would take GPU 0's memory and make vLLM
    # spawn its workers instead of forking them.
    engine = engine_class.from_engine_args(engine_args, usage_context=usage)
    report["engine_ready_s"] = round(time.monotonic() - started, 2)
    report["extra_jit"] = _bake_extra_jit()
    # The CPU build's sampler is plain torch: nothing there compiles per request.
    report["request_warmup"] = {"skipped": "CPU build"} if cpu else _warm_requests(engine)
    # Every worker answers for itself, through vLLM's own RPC to all of them: its rank, its
    # memory counters and where it saved its artifacts (the one worker is this process at 1).
    ranks.fold_ranks(report, engine.collective_rpc(adapter.rank_report))
    in_process = engine.vllm_config.parallel_config.world_size == 1
    report["vllm_config_hash"] = vllm.config_hash(engine.vllm_config)
    report["hashed_env"] = given_env
    predict.finish_at_build(report)
    engine.engine_core.shutdown()
    del engine
    # Dynamo's code cache and guards keep the compiled module (and through it the KV cache)
    # alive; the build should end holding nothing.
    torch._dynamo.reset()
    gc.collect()
    if in_process and not cpu:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        report["allocated_after_bytes"] = torch.cuda.memory_allocated()
    report["wall_s"] = round(time.monotonic() - started, 2)
    return dict(report)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernelbake-vllm-compile-only")
    parser.add_argument("--report", required=True, type=Path)
    parser.add_argument("serve_argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    serve_argv = args.serve_argv[1:] if args.serve_argv[:1] == ["--"] else args.serve_argv
    report = run(serve_argv)
    args.report.write_text(json.dumps(report, indent=1, sort_keys=True, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
