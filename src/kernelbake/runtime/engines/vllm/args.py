"""Serve arguments ↔ vLLM command-line flags. Pure, so the mapping is tested without vLLM.

Compile-only and serving go through the same list of flags, parsed by vLLM's own
``vllm serve`` parser in both places: whatever the flags mean to vLLM, they mean the same
at build and at serve time, which is what makes the compile hash match.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from kernelbake.contract import jsondoc
from kernelbake.contract.serve import Quantization, ServeArgs

# The fallback only (a bundle without vLLM's recorded identity, see predict.py, which asks
# vLLM itself): flags whose values enter vLLM's compile hash or the shapes it compiles for.
# Not here, because an H200 start with them hit the baked caches: --load-format,
# --gpu-memory-utilization, --kv-cache-memory-bytes, --seed
# (bench/results/vllm-0.26.0-h200-image-flow/).
SHAPE_FLAGS: dict[str, str] = {
    "--dtype": "dtype",
    "--quantization": "quantization",
    "-q": "quantization",
    "--tensor-parallel-size": "tensor parallel size",
    "-tp": "tensor parallel size",
    "--pipeline-parallel-size": "pipeline parallel size",
    "-pp": "pipeline parallel size",
    "--enable-expert-parallel": "expert parallelism",
    "--max-model-len": "max_model_len",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--max-num-seqs": "max_num_seqs (Triton kernel specialisation)",
    "--compilation-config": "compilation config",
    "-O": "compilation config",
    "-cc": "compilation config",
    "--kv-cache-dtype": "KV cache dtype",
    "--enforce-eager": "eager mode (no compiled graphs at all)",
    "--revision": "model revision",
    "--hf-overrides": "model config overrides",
    "--speculative-config": "speculative decoding",
    "--enable-lora": "LoRA buffers",
    "--model": "model path",
    "--data-parallel-size": "data parallel size",
    "-dp": "data parallel size",
}


def serve_flags(serve: ServeArgs) -> list[str]:
    """The vLLM flags for everything the key pins, in a fixed order."""
    flags = [
        "--dtype",
        serve.dtype.value,
        "--tensor-parallel-size",
        str(serve.tensor_parallel_size),
        "--pipeline-parallel-size",
        str(serve.pipeline_parallel_size),
        "--max-model-len",
        str(serve.max_model_len),
        "--max-num-batched-tokens",
        str(serve.max_num_batched_tokens),
        "--max-num-seqs",
        str(serve.max_num_seqs),
    ]
    if serve.quantization is not Quantization.NONE:
        flags += ["--quantization", serve.quantization.value]
    if serve.expert_parallel_size > 1:
        flags.append("--enable-expert-parallel")
    if json.loads(serve.compilation_config):
        flags += ["--compilation-config", serve.compilation_config]
    return flags


def serve_argv(
    model_path: str, serve: ServeArgs, user_args: Sequence[str] = (), pins: Mapping[str, object] | None = None
) -> list[str]:
    """``vllm serve`` argv: the model directory positionally (vLLM hashes it, so compile and
    serve use the same absolute path), our pinned flags, the spec's extra args, then the
    user's, which vLLM lets win. ``pins``: Inductor options the build fixed (see
    ``with_pins``)."""
    ours = with_pins([model_path, *serve_flags(serve), *serve.extra_args], pins or {})
    return ["vllm", "serve", *ours, *user_args]


def with_pins(argv: Sequence[str], pins: Mapping[str, object]) -> list[str]:
    """``argv`` (``MODEL [flags]``) with ``pins`` set in the compilation config's
    ``inductor_compile_config`` unless that config sets them: the options vLLM would otherwise
    derive from its logging level (``identity.log_level_pins``), fixed as flags so that vLLM
    parses them as the user's own at build and at serve. A later ``--compilation-config``
    from the user replaces this one, as vLLM lets it."""
    out = list(argv)
    if not pins:
        return out
    at = next((i for i, a in enumerate(out) if a in ("--compilation-config", "-cc", "-O")), None)
    if at is None or at + 1 >= len(out) or not out[at + 1].lstrip().startswith("{"):
        config: dict[str, object] = {}
        out[1:1] = ["--compilation-config", ""]
        at = 1
    else:
        config = jsondoc.loads(out[at + 1])
    options = config.setdefault("inductor_compile_config", {})
    assert isinstance(options, dict)
    for k, v in pins.items():
        options.setdefault(k, v)
    out[at] = "--compilation-config"
    out[at + 1] = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return out


def flag_name(arg: str) -> str | None:
    if not arg.startswith("-") or arg == "-":
        return None
    return arg.split("=", 1)[0]


def shape_overrides(user_args: Sequence[str], serve: ServeArgs) -> list[str]:
    """User flags that would change what was compiled, each with why (empty when none).

    A flag repeating the baked value exactly is not an override.
    """
    baked = serve_flags(serve)
    baked_values: dict[str, str] = {}
    for i, a in enumerate(baked):
        if a.startswith("--") and i + 1 < len(baked) and not baked[i + 1].startswith("--"):
            baked_values[a] = baked[i + 1]
    found = []
    for i, arg in enumerate(user_args):
        name = flag_name(arg)
        if name is None or name not in SHAPE_FLAGS:
            continue
        if "=" in arg:
            value: str | None = arg.split("=", 1)[1]
        elif i + 1 < len(user_args) and not user_args[i + 1].startswith("-"):
            value = user_args[i + 1]
        else:
            value = None
        canonical = {
            "-tp": "--tensor-parallel-size",
            "-pp": "--pipeline-parallel-size",
            "-q": "--quantization",
        }.get(name, name)
        if value is not None and baked_values.get(canonical) == value:
            continue
        shown = f"{name} {value}" if value is not None else name
        found.append(f"{shown} changes the {SHAPE_FLAGS[name]}")
    return found
