"""The torch engine's model and compiled warm-up, shared by the compile stage and ``serve``.

Both stages call ``load_model`` and ``warm_up`` with the same target, so Dynamo sees the same
code, guards and shape sequence and Inductor computes the same cache keys: that is what turns
the baked FX-graph and AOTAutograd caches into hits.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from kernelbake.contract.serve import Dtype
from kernelbake.contract.target import TargetConfig

# Inductor counters that show whether the baked caches were used.
_COUNTERS = (
    ("inductor", "fxgraph_cache_hit"),
    ("inductor", "fxgraph_cache_miss"),
    ("inductor", "fxgraph_cache_bypass"),
    ("aot_autograd", "autograd_cache_hit"),
    ("aot_autograd", "autograd_cache_miss"),
    ("aot_autograd", "autograd_cache_bypass"),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmUp:
    # Seconds of the first call of each shape (the first includes Dynamo, AOT and Inductor).
    calls: tuple[tuple[str, float], ...]
    counters: dict[str, int]
    compiled: str  # what was handed to torch.compile

    @property
    def first_call_s(self) -> float:
        return self.calls[0][1] if self.calls else 0.0

    @property
    def total_s(self) -> float:
        return sum(s for _, s in self.calls)

    def to_json(self) -> dict[str, Any]:
        return {
            "first_call_s": round(self.first_call_s, 3),
            "warmup_s": round(self.total_s, 3),
            "calls": {name: round(s, 3) for name, s in self.calls},
            "counters": self.counters,
            "compiled": self.compiled,
        }


def _torch_dtype(dtype: Dtype) -> Any:
    import torch

    return {
        Dtype.AUTO: torch.float32,
        Dtype.FLOAT32: torch.float32,
        Dtype.FLOAT16: torch.float16,
        Dtype.BFLOAT16: torch.bfloat16,
    }[dtype]


def load_model(target: TargetConfig) -> Any:
    """The model from its config with random weights (no hub, no weight files), in eval mode."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(target.key.model_path)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=_torch_dtype(target.serve.dtype))
    model.eval()
    return model


def compile_model(model: Any) -> str:
    """Compile each repeated block (regional compilation) when the model has them.

    The blocks share code, so Dynamo traces one and reuses it; and the rotary embedding's
    autocast context stays outside the compiled region, which lets AOTAutograd cache the
    graphs instead of bypassing its cache. Falls back to the whole model.
    """
    import torch

    layers = getattr(getattr(model, "model", None), "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
        for layer in layers:
            layer.compile()
        return f"model.model.layers[0..{len(layers) - 1}]"
    model.compile()
    return "model"


def warm_up(model: Any, vocab_size: int, shapes: Sequence[tuple[int, int]], compiled: str) -> WarmUp:
    import torch
    from torch._dynamo.utils import counters

    calls = []
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for batch, seq in shapes:
            ids = torch.randint(0, vocab_size, (batch, seq), generator=generator)
            start = time.perf_counter()
            model(input_ids=ids, use_cache=False)
            calls.append((f"{batch}x{seq}", time.perf_counter() - start))
    found = {name: int(counters[group][name]) for group, name in _COUNTERS}
    return WarmUp(calls=tuple(calls), counters=found, compiled=compiled)


def load_and_warm(
    target: TargetConfig,
    shapes: Sequence[tuple[int, int]] | None = None,
    *,
    before_compile: Callable[[], None] | None = None,
) -> tuple[Any, WarmUp]:
    """``before_compile`` runs after the imports and the model's construction, before
    anything can open Inductor's cache (``serve`` holds the cache gate there)."""
    model = load_model(target)
    if before_compile is not None:
        before_compile()
    compiled = compile_model(model)
    report = warm_up(model, int(model.config.vocab_size), shapes or target.shapes, compiled)
    return model, report
