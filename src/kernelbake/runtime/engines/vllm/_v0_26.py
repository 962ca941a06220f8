"""Compile-only for vLLM 0.26 through its public extension points. Version-specific: every
vLLM internal this touches is named here and nowhere else.

The build stage runs vLLM's *normal* start-up (config, worker, profile run, KV cache set-up,
CUDA-graph capture, sampler and kernel warm-up), so every JIT cache fills exactly as it
would at serve time, with four changes that take the weights out:

1. load format ``kernelbake_meta`` builds the model on the meta device, runs weight
   post-processing there, and swaps parameters for FakeTensors on the GPU: Dynamo and
   Inductor see real shapes, dtypes and devices, and no weight memory is ever allocated.
   The load format is not part of vLLM's compile hash, so the artifacts match a real start.
2. Once vLLM has saved its AOT artifact, the compiled forward is replaced by one that
   returns zeros of the right shape: everything downstream (sampler, input preparation,
   CUDA-graph capture) runs its real kernels on real buffers, and the weights are never read.
3. The LM head returns zeros of the right shape and dtype, for the same reason.
4. The KV-cache admission check is skipped: the build allocates only as many KV blocks as
   the warm-up batch needs, not enough for max_model_len, which serving never sees.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from kernelbake.runtime.engines.vllm.compat_layer import Hook, VllmLookups, resolve
from kernelbake.runtime.engines.vllm.plugin import WEIGHTS_ENV, WeightsMode
from kernelbake.runtime.prediction import Store

if TYPE_CHECKING:
    import torch

LOAD_FORMAT = "kernelbake_meta"
# vLLM's V1 scheduler (the async scheduler subclasses it and keeps both methods misses.py wraps).
SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
# Where vLLM checks that the KV cache fits max_model_len (0.34 moved it to kv_cache_planning).
KV_ADMISSION_MODULE = "vllm.v1.core.kv_cache_utils"

# What identity.py, compile-only, check and the warm-up (through LOOKUPS) and the rank report
# ask of vLLM, the same in 0.26 and 0.32: its version, config hashing, compiler's factors, the
# config hook, the traced files, the compile switches and directories, the model registry, the
# engine and its request parameters, the parallel groups.
IDENTITY_HOOKS: tuple[Hook, ...] = (
    Hook("vllm:__version__"),
    Hook("vllm:SamplingParams"),
    Hook("vllm.config.utils:hash_factors", ("items",)),
    Hook("vllm.config.utils:normalize_value", ("x",)),
    Hook("vllm.utils.hashing:safe_hash", ("data", "usedforsecurity")),
    Hook("vllm.config:CompilationConfig"),
    Hook("vllm.engine.arg_utils:EngineArgs.create_engine_config", ("self", "usage_context", "headless")),
    Hook("vllm.compilation.backends:make_compiler", ("compilation_config",)),
    Hook("vllm.compilation.backends:VllmBackend.__call__", ("self", "graph", "example_inputs")),
    Hook("vllm.compilation.caching:aot_compile_hash_factors", ("vllm_config",)),
    Hook("vllm.compilation.compiler_interface:get_inductor_factors", ()),
    Hook("vllm.envs:VLLM_USE_AOT_COMPILE"),
    Hook("vllm.envs:VLLM_DISABLE_COMPILE_CACHE"),
    # aot_artifact_of: whether the artifact holds Inductor's graphs, and the code that loads them.
    Hook("vllm.envs:VLLM_USE_MEGA_AOT_ARTIFACT"),
    Hook(
        "vllm.compilation.caching:reconstruct_serializable_fn_from_mega_artifact",
        (
            "state",
            "standalone_compile_artifacts",
            "vllm_config",
            "sym_shape_indices_map",
            "returns_tuple_map",
            "fake_mode",
        ),
    ),
    Hook("vllm.envs:VLLM_CACHE_ROOT"),
    Hook("vllm.model_executor.models.registry:ModelRegistry.models"),
    Hook("vllm.distributed:get_pp_group", ()),
    Hook("vllm.distributed:get_tp_group", ()),
    # launches.py wraps activate and asks is_active: moved, the first-launch preload is off.
    Hook("vllm.utils.jit_monitor:activate", ("mode", "verbose")),
    Hook("vllm.utils.jit_monitor:is_active", ()),
    # misses.py notes the batches that compiled where the scheduler takes their results (the
    # batch's requests still held) and hooks the compilers at the first batch.
    Hook(f"{SCHEDULER}.schedule", ("self", "throttle_prefills")),
    Hook(f"{SCHEDULER}.update_from_output", ("self", "scheduler_output", "model_runner_output")),
    # snapshot_weights: the sleep-mode allocator's weight allocations and its cudaMemcpy.
    Hook("vllm.device_allocator.cumem:CuMemAllocator.get_instance", ()),
    Hook("vllm.device_allocator.cumem:libcudart"),
)

# Every vLLM object this module (and compile_only through it) calls or patches, with its
# parameters in 0.26.0 (read from the release's source). CI checks the same list for each
# release it can import (_v0_32.HOOKS, tests/integration/test_vllm_cpu_image.py).
HOOKS: tuple[Hook, ...] = (
    Hook("vllm.entrypoints.openai.cli_args:make_arg_parser", ("parser",)),
    Hook("vllm.engine.arg_utils:AsyncEngineArgs.from_cli_args", ("args",)),
    Hook("vllm.utils.argparse_utils:FlexibleArgumentParser"),
    Hook(
        "vllm.v1.engine.llm_engine:LLMEngine.from_engine_args",
        ("engine_args", "usage_context", "stat_loggers", "enable_multiprocessing"),
    ),
    Hook("vllm.usage.usage_lib:UsageContext.OPENAI_API_SERVER"),
    Hook("vllm.envs:compile_factors", ()),
    Hook("vllm.compilation.decorators:_try_load_aot_compiled_fn", ("model", "aot_compilation_path")),
    Hook("vllm.model_executor.model_loader:register_model_loader", ("load_format",)),
    Hook("vllm.model_executor.model_loader.base_loader:BaseModelLoader"),
    Hook(
        "vllm.model_executor.model_loader.utils:initialize_model",
        ("vllm_config", "prefix", "model_class", "model_config"),
    ),
    Hook(
        "vllm.model_executor.model_loader.utils:process_weights_after_loading",
        ("model", "model_config", "target_device"),
    ),
    Hook("vllm.utils.torch_utils:set_default_torch_dtype", ("dtype",)),
    Hook(
        "vllm.model_executor.layers.logits_processor:LogitsProcessor._apply_head",
        ("self", "lm_head", "hidden_states", "embedding_bias"),
    ),
    Hook(
        "vllm.v1.core.kv_cache_utils:_check_enough_kv_cache_memory",
        ("available_memory", "get_needed_memory", "max_model_len", "estimate_max_model_len"),
    ),
    Hook("vllm.v1.worker.gpu.model_runner:GPUModelRunner.profile_run", ("self",)),
    *IDENTITY_HOOKS,
)


def parse_with(make_arg_parser: Any, argv: Sequence[str]) -> Any:
    """EngineArgs from ``vllm serve`` flags, through vLLM's own serve parser (wherever the
    release keeps it: each adapter passes its ``make_arg_parser``)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(list(argv))
    if getattr(ns, "model_tag", None):
        ns.model = ns.model_tag
    return AsyncEngineArgs.from_cli_args(ns)


def parse_serve_argv(argv: Sequence[str]) -> Any:
    from vllm.entrypoints.openai.cli_args import make_arg_parser

    return parse_with(make_arg_parser, argv)


def load_format() -> str:
    """The load format compile-only builds with: the meta loader below (GPU only in 0.26)."""
    return LOAD_FORMAT


def _fakeify(model: torch.nn.Module, device: torch.device) -> int:
    """Replace meta parameters and buffers by FakeTensors on ``device``; returns how many.

    Tied weights stay tied: one FakeTensor per distinct meta tensor.
    """

    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    converter = mode.fake_tensor_converter
    # Keyed by the original tensor object, which stays referenced here so its id cannot be
    # reused: tied weights (one Parameter in two modules) get one FakeTensor.
    memo: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    count = 0

    def convert(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            data = t.data
            memo[id(t)] = (t, data, converter.from_meta_and_device(mode, data, device))
        return memo[id(t)][2]

    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and param.is_meta:
                # A bare FakeTensor: nn.Parameter() around one loses its shape.
                fake = convert(param)
                for attr, value in param.__dict__.items():
                    if attr not in fake.__dict__ and attr != "_is_param":
                        setattr(fake, attr, value)
                module._parameters[name] = fake
                count += 1
        for name, buf in list(module._buffers.items()):
            if buf is not None and buf.is_meta:
                module._buffers[name] = convert(buf)
                count += 1
    return count


def _zeros_forward(hidden_size: int, dtype: torch.dtype, *, last_rank: bool = True) -> Callable[..., Any]:
    """Stands in for a compiled decoder forward: (input_ids, positions, intermediate_tensors,
    inputs_embeds) → hidden states, or on a pipeline rank before the last, the intermediate
    tensors the next rank receives, shaped by the model's own ``make_empty_intermediate_tensors``."""
    import torch

    def forward(_module: Any, *args: Any, **kwargs: Any) -> Any:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        embeds = kwargs.get("inputs_embeds", args[3] if len(args) > 3 else None)
        # Pipeline ranks after the first get neither ids nor embeddings; positions are [n]
        # or, with M-RoPE, [3, n].
        if input_ids is not None:
            tokens, device = input_ids.shape[0], input_ids.device
        elif embeds is not None:
            tokens, device = embeds.shape[0], embeds.device
        elif positions is not None:
            tokens, device = positions.shape[-1], positions.device
        else:
            raise RuntimeError(
                "kernelbake compile-only: forward called without input_ids, embeds or positions"
            )
        if not last_rank:
            return _module.make_empty_intermediate_tensors(tokens, dtype, device)
        return torch.zeros(tokens, hidden_size, dtype=dtype, device=device)

    return forward


def _last_pp_rank() -> bool:
    from vllm.distributed import get_pp_group

    return bool(get_pp_group().is_last_rank)


def rank_report(worker: Any) -> dict[str, Any]:
    """Sent to every worker by ``collective_rpc`` at the end of compile-only: this rank's
    place in the parallel groups, its own memory counters (the peak since the AOT save is the
    warm-up's) and what the patches recorded in its process (``ranks`` reads it)."""
    import torch
    from vllm.distributed import get_pp_group, get_tp_group

    from kernelbake.runtime.engines.vllm.plugin import REPORT

    parallel = worker.vllm_config.parallel_config
    answer = {k: v for k, v in REPORT.items() if k != "installed"}
    # The files Dynamo traced, where vLLM's decorator recorded them: on the CPU build stock
    # Inductor compiles and vLLM's backend (``identity.record_traced_files``) is never called.
    traced = getattr(worker.vllm_config.compilation_config, "traced_files", ())
    answer["traced_files"] = sorted(f for f in traced if f != "<string>")
    # The CPU build (_v0_32) has no GPU memory to count.
    gpu = torch.cuda.is_available()
    answer.update(
        rank=parallel.rank,
        dp_rank=parallel.data_parallel_index,
        tp_rank=get_tp_group().rank_in_group,
        pp_rank=get_pp_group().rank_in_group,
        peak_after_aot_save_bytes=torch.cuda.max_memory_allocated() if gpu else 0,
        allocated_at_end_bytes=torch.cuda.memory_allocated() if gpu else 0,
    )
    return answer


def _weights_mode(model_config: Any, report: MutableMapping[str, Any]) -> WeightsMode:
    """The mode ``WEIGHTS_ENV`` names; ``auto`` asks vLLM's model config whether the forward
    calls kernels that compile on first use (MoE, quantized layers): then ``dummy``."""
    weights = WeightsMode(os.environ.get(WEIGHTS_ENV, WeightsMode.AUTO.value))
    if weights is WeightsMode.AUTO:
        moe, quantized = bool(model_config.is_moe), bool(model_config.is_quantized)
        weights = WeightsMode.DUMMY if moe or quantized else WeightsMode.FAKE
        report["weights_reason"] = f"auto: is_moe={moe}, is_quantized={quantized}"
    report["weights_mode"] = weights.value
    return weights


def _stub_after_save(
    model: torch.nn.Module, stub: Callable[..., Any] | None, report: MutableMapping[str, Any]
) -> int:
    """After each compiled submodule saves its AOT artifact, swap in ``stub`` (``None``:
    keep the compiled forward). Returns how many compiled submodules were found (0 means
    vLLM would not compile this model)."""
    import torch

    found = 0
    for module in model.modules():
        save = getattr(module, "save_aot_compiled_function", None)
        if save is None:
            continue
        found += 1

        def save_then_stub(_m: Any = module, _save: Callable[[], None] = save) -> None:
            _save()
            report["aot_saved"] = report.get("aot_saved", 0) + 1
            # Where this rank's artifact went: ``ranks`` checks it lies in the rank's directory.
            saved = getattr(_m, "_aot_compilation_path", None)
            if saved:
                report.setdefault("aot_paths", []).append(str(saved))
            report["allocated_at_aot_save_bytes"] = torch.cuda.memory_allocated()
            report["peak_at_aot_save_bytes"] = torch.cuda.max_memory_allocated()
            # From here on the peak counter measures the warm-up (KV cache, sampler, graphs).
            torch.cuda.reset_peak_memory_stats()
            if stub is not None:
                _m.aot_compiled_fn = stub

        module.save_aot_compiled_function = save_then_stub
    return found


def install(report: MutableMapping[str, Any], *, kv_admission: str = KV_ADMISSION_MODULE) -> None:
    """Register the meta loader and patch what compile-only needs. Idempotent. ``kv_admission``:
    the module holding the KV-cache admission check in the running release."""
    if report.get("installed"):
        return
    report["installed"] = True
    _register_meta_loader(report)
    _zero_logits_head()
    _stub_after_aot_load(report)
    _skip_kv_cache_admission(kv_admission)
    _lean_profile_run(report)


def _register_meta_loader(report: MutableMapping[str, Any]) -> None:
    """Changes 1 and 2 of the module docstring: the ``LOAD_FORMAT`` loader builds the model
    without reading weights, and its forward returns zeros once the AOT artifact is saved."""
    import torch
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    class MetaLoader(BaseModelLoader):  # type: ignore[misc]
        def download_model(self, model_config: Any) -> None:
            return None

        def load_weights(self, model: torch.nn.Module, model_config: Any) -> None:
            return None

        def load_model(self, vllm_config: Any, model_config: Any, prefix: str = "") -> torch.nn.Module:
            device = torch.device(vllm_config.device_config.device)
            if device.index is None and device.type == "cuda":
                device = torch.device("cuda", torch.cuda.current_device())
            weights = _weights_mode(model_config, report)
            if weights is WeightsMode.DUMMY:
                from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

                model = DummyModelLoader(self.load_config).load_model(vllm_config, model_config, prefix)
                # The forward stays real: only the AOT saves are recorded.
                report["compiled_modules"] = _stub_after_save(model, None, report)
                report["allocated_after_load_bytes"] = torch.cuda.memory_allocated()
                return model.eval()
            init_device = torch.device("meta") if weights is WeightsMode.FAKE else device
            with set_default_torch_dtype(model_config.dtype), init_device:
                model = initialize_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)
            process_weights_after_loading(model, model_config, init_device)
            if weights is WeightsMode.FAKE:
                report["fake_tensors"] = _fakeify(model, device)
            stub = _zeros_forward(
                model_config.get_hidden_size(), model_config.dtype, last_rank=_last_pp_rank()
            )
            report["compiled_modules"] = _stub_after_save(model, stub, report)
            report["allocated_after_load_bytes"] = torch.cuda.memory_allocated()
            return model.eval()

    register_model_loader(LOAD_FORMAT)(MetaLoader)


def _zero_logits_head() -> None:
    """Change 3: the LM head returns zeros of the right shape and dtype."""
    import torch
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    def apply_head(self: Any, lm_head: Any, hidden_states: torch.Tensor, embedding_bias: Any) -> torch.Tensor:
        dtype = self.head_dtype or hidden_states.dtype
        shape = (*hidden_states.shape[:-1], lm_head.weight.shape[0])
        return torch.zeros(shape, dtype=dtype, device=hidden_states.device)

    LogitsProcessor._apply_head = apply_head


def _stub_after_aot_load(report: MutableMapping[str, Any]) -> None:
    """Change 2 for an artifact vLLM loads rather than saves."""
    from vllm.compilation import decorators

    original_try_load = decorators._try_load_aot_compiled_fn

    @functools.wraps(original_try_load)
    def try_load(model: Any, path: str) -> Any:
        # A rebuild on top of an existing bundle: the artifact loads (proving it is valid),
        # then the stub takes over as after a fresh compile.
        loaded = original_try_load(model, path)
        if loaded is None:
            return None
        report["aot_loaded"] = report.get("aot_loaded", 0) + 1
        report.setdefault("aot_paths", []).append(path)
        if report.get("weights_mode") == WeightsMode.DUMMY.value:
            return loaded
        cfg = model.vllm_config.model_config
        return _zeros_forward(cfg.get_hidden_size(), cfg.dtype, last_rank=_last_pp_rank())

    decorators._try_load_aot_compiled_fn = try_load


def _skip_kv_cache_admission(module: str) -> None:
    """Change 4: the build allocates KV blocks for the warm-up batch only, not for max_model_len.
    The check is looked up as a module global by its callers, so replacing it there is enough."""
    import importlib

    def skip_admission_check(*args: Any, **kwargs: Any) -> None:
        return None

    vars(importlib.import_module(module))["_check_enough_kv_cache_memory"] = skip_admission_check


def _lean_profile_run(report: MutableMapping[str, Any]) -> None:
    """During the compile (vLLM's profile run), lend out the sampler's penalty counts.

    ``output_bin_counts`` is max_num_seqs x vocab int32 (148 MiB for Qwen3-8B), allocated at
    start-up for serving and untouched by the profile run's dummy batch, which has no
    penalties. Freed for the compile and re-created, zeroed as vLLM makes it, for the warm-up.
    """
    import torch
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    original = GPUModelRunner.profile_run

    @functools.wraps(original)
    def profile_run(self: Any, *args: Any, **kwargs: Any) -> None:
        penalties: Any = getattr(getattr(self, "sampler", None), "penalties_state", None)
        counts = getattr(penalties, "output_bin_counts", None)
        if not isinstance(counts, torch.Tensor):
            original(self, *args, **kwargs)
            return
        shape, dtype, device = counts.shape, counts.dtype, counts.device
        penalties.output_bin_counts = torch.empty(0, dtype=dtype, device=device)
        del counts
        report["lent_bytes"] = int(torch.Size(shape).numel()) * torch.empty(0, dtype=dtype).element_size()
        try:
            original(self, *args, **kwargs)
        finally:
            penalties.output_bin_counts = torch.zeros(shape, dtype=dtype, device=device)

    GPUModelRunner.profile_run = profile_run


# -- where identity.py finds vLLM's objects (LOOKUPS) ----------------------------------------


def _version() -> str:
    from vllm import __version__

    return str(__version__)


def _config_modules() -> list[Any]:
    # Each config module of vLLM's config package imports its hash helpers at module load.
    return [m for name, m in list(sys.modules.items()) if name.startswith("vllm.config") and m is not None]


def _normalize_value(value: Any) -> Any:
    from vllm.config.utils import normalize_value

    return normalize_value(value)


def _hash_factors(items: dict[str, Any]) -> str:
    # Looked up at call time, as vLLM's configs do (identity wraps it there while recording).
    from vllm.config.utils import hash_factors

    return str(hash_factors(items))


def _env_compile_factors() -> dict[str, Any]:
    import vllm.envs as envs

    return dict(envs.compile_factors())


def _make_compiler(compilation_config: Any) -> Any:
    from vllm.compilation.backends import make_compiler

    return make_compiler(compilation_config)


def _compiler_hash(compiler: Any, vllm_config: Any) -> str:
    return str(compiler.compute_hash(vllm_config))


def _config_hash(vllm_config: Any) -> str:
    return str(vllm_config.compute_hash())


def _aot_compile_hash_factors(vllm_config: Any) -> Any:
    from vllm.compilation.caching import aot_compile_hash_factors

    return aot_compile_hash_factors(vllm_config)


def _inductor_factors() -> Sequence[Any]:
    from vllm.compilation.compiler_interface import get_inductor_factors

    return list(get_inductor_factors())


def _aot_compile_enabled() -> bool:
    import vllm.envs as envs

    return bool(envs.VLLM_USE_AOT_COMPILE)


def _compile_cache_enabled(compilation_config: Any) -> bool:
    import vllm.envs as envs

    try:
        from vllm.compilation.compiler_interface import is_compile_cache_enabled

        return bool(is_compile_cache_enabled(dict(compilation_config.inductor_compile_config or {})))
    except Exception:
        # A build without it: VLLM_DISABLE_COMPILE_CACHE is then vLLM's only switch.
        return not bool(envs.VLLM_DISABLE_COMPILE_CACHE)


def aot_artifact_of(values: Mapping[str, Any]) -> dict[str, Any]:
    """How vLLM finds and loads its AOT artifact, for vLLM's own values of its variables
    (``vllm.envs``, which resolves their defaults: ``values`` holds the three named here). The
    same in 0.26, 0.32 and 0.34 (``vllm/compilation/decorators.py`` and ``caching.py``, read
    from each release's source):

    - the decorator looks for ``VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/HASH/
      rank_R_D/model`` whatever ``compilation_config.cache_dir`` says, and only when
      ``VLLM_USE_AOT_COMPILE`` is on and ``VLLM_DISABLE_COMPILE_CACHE`` off;
    - with ``VLLM_USE_MEGA_AOT_ARTIFACT`` (vLLM's default from torch 2.12) the artifact holds
      Inductor's compiled graphs (``reconstruct_serializable_fn_from_mega_artifact``: torch's
      ``AOTCompiledArtifact``, which loads its bundled entries without Inductor's FX-graph or
      AOTAutograd caches), so it reads nothing else;
    - without it (torch 2.11: vLLM 0.26 on the H200) the artifact holds the traced graph, which
      vLLM's backend compiles again through its per-graph cache (``compilation_config.
      cache_dir``) and Inductor's caches, where every entry then loads.
    """
    loads = bool(values["VLLM_USE_AOT_COMPILE"]) and not bool(values["VLLM_DISABLE_COMPILE_CACHE"])
    if bool(values["VLLM_USE_MEGA_AOT_ARTIFACT"]):
        reads = [Store.ARTIFACT]
    else:
        reads = [Store.ARTIFACT, Store.GRAPH_CACHE, Store.INDUCTOR]
    return {"loads": loads, "reads": [r.value for r in reads]}


_AOT_VARIABLES = ("VLLM_USE_AOT_COMPILE", "VLLM_DISABLE_COMPILE_CACHE", "VLLM_USE_MEGA_AOT_ARTIFACT")


def _aot_artifact() -> dict[str, Any]:
    import vllm.envs as envs

    return aot_artifact_of({name: getattr(envs, name) for name in _AOT_VARIABLES})


def _cache_root() -> str:
    import vllm.envs as envs

    return str(envs.VLLM_CACHE_ROOT)


def _model_module(arch: str) -> str | None:
    from vllm.model_executor.models.registry import ModelRegistry

    module = getattr(ModelRegistry.models.get(arch), "module_name", None)
    return str(module) if module else None


def _imported(path: str) -> Callable[[], Any]:
    """A lookup of the object at ``path`` (``module:attr.attr``, as ``HOOKS`` writes it; a bare
    module path is the module), imported when called, not when this module loads."""
    return functools.partial(resolve, path)


# The tag vLLM's sleep-mode allocator gives what the model's loading allocates.
WEIGHTS_TAG = "weights"


def _weight_allocations() -> list[tuple[int, int, bool]]:
    from vllm.device_allocator.cumem import CuMemAllocator

    allocator = CuMemAllocator.get_instance()
    return sorted(
        # handle: (device, size as mapped, address, memory handle); ``is_asleep`` since 0.26.
        (int(ptr), int(data.handle[1]), bool(getattr(data, "is_asleep", False)))
        for ptr, data in allocator.pointer_to_data.items()
        if data.tag == WEIGHTS_TAG
    )


def _device_copy(dst: int, src: int, n: int) -> None:
    # The allocator's own binding of cudaMemcpy (cudaMemcpyDefault: either way, by address).
    from vllm.device_allocator.cumem import libcudart

    libcudart.cudaMemcpy(dst, src, n)


LOOKUPS = VllmLookups(
    version=_version,
    config_utils=_imported("vllm.config.utils"),
    config_modules=_config_modules,
    normalize_value=_normalize_value,
    hash_factors=_hash_factors,
    env_compile_factors=_env_compile_factors,
    make_compiler=_make_compiler,
    compiler_hash=_compiler_hash,
    own_config_factors=None,
    cache_key_factors=None,
    config_hash=_config_hash,
    aot_compile_hash_factors=_aot_compile_hash_factors,
    inductor_factors=_inductor_factors,
    aot_compile_enabled=_aot_compile_enabled,
    compile_cache_enabled=_compile_cache_enabled,
    aot_artifact=_aot_artifact,
    cache_root=_cache_root,
    model_module=_model_module,
    compilation_config_class=_imported("vllm.config:CompilationConfig"),
    engine_args_class=_imported("vllm.engine.arg_utils:EngineArgs"),
    backend_class=_imported("vllm.compilation.backends:VllmBackend"),
    api_server_usage=_imported("vllm.usage.usage_lib:UsageContext.OPENAI_API_SERVER"),
    engine_class=_imported("vllm.v1.engine.llm_engine:LLMEngine"),
    sampling_params_class=_imported("vllm:SamplingParams"),
    jit_monitor=_imported("vllm.utils.jit_monitor"),
    scheduler=SCHEDULER,
    weight_allocations=_weight_allocations,
    device_copy=_device_copy,
)


if TYPE_CHECKING:
    # This module is a release adapter: mypy checks it has all ``ReleaseAdapter`` asks for.
    from kernelbake.runtime.engines.vllm import _v0_26 as _this
    from kernelbake.runtime.engines.vllm.compat_layer import ReleaseAdapter

    _conforms: ReleaseAdapter = _this
