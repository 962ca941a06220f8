"""Hypothesis strategies for the contract's value types."""

from __future__ import annotations

import json

from hypothesis import strategies as st

from kernelbake.contract.key import CacheKey, Engine
from kernelbake.contract.serve import Dtype, Quantization, ServeArgs
from kernelbake.contract.snapshot import SnapshotKey, Weights
from kernelbake.contract.target import TargetConfig

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)
ints = st.integers(min_value=0, max_value=2**20)


@st.composite
def keys(draw: st.DrawFn) -> CacheKey:
    kw: dict[str, object] = {}
    for name in CacheKey.field_order():
        if name == "engine":
            kw[name] = draw(st.sampled_from(list(Engine)))
        elif name in ("tp", "pp", "ep", "max_model_len", "max_num_batched_tokens"):
            kw[name] = draw(ints)
        elif name == "model_path":
            kw[name] = "/" + draw(text)
        else:
            kw[name] = draw(text)
    return CacheKey(**kw)  # type: ignore[arg-type]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=8,
)
_env = st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,15}", fullmatch=True), text, max_size=4)


@st.composite
def serve_args(draw: st.DrawFn) -> ServeArgs:
    return ServeArgs(
        dtype=draw(st.sampled_from(list(Dtype))),
        quantization=draw(st.sampled_from(list(Quantization))),
        tensor_parallel_size=draw(ints),
        pipeline_parallel_size=draw(ints),
        expert_parallel_size=draw(ints),
        max_model_len=draw(ints),
        max_num_batched_tokens=draw(ints),
        max_num_seqs=draw(ints),
        compilation_config=json.dumps(
            draw(st.dictionaries(text, _json, max_size=3)), sort_keys=True, separators=(",", ":")
        ),
        env=tuple(sorted(draw(_env).items())),
        extra_args=tuple(draw(st.lists(text, max_size=3))),
    )


@st.composite
def target_configs(draw: st.DrawFn) -> TargetConfig:
    return TargetConfig(
        key=draw(keys()),
        gpu=draw(text),
        serve=draw(serve_args()),
        shapes=tuple(draw(st.lists(st.tuples(ints, ints), max_size=3))),
        cache_root="/" + draw(text),
    )


_word = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Zs", "Cc")), min_size=1, max_size=20)
_digest = st.from_regex(r"sha256:[0-9a-f]{64}", fullmatch=True)


@st.composite
def snapshot_keys(draw: st.DrawFn) -> SnapshotKey:
    kw: dict[str, object] = {}
    for name in SnapshotKey.field_order():
        if name == "cache_key":
            kw[name] = draw(keys())
        elif name in ("image", "serve_env"):
            kw[name] = draw(_digest)
        elif name == "gpu_count":
            kw[name] = draw(st.integers(min_value=0, max_value=64))
        elif name == "weights":
            kw[name] = draw(st.sampled_from(list(Weights)))
        elif name == "cpu_flags":
            kw[name] = " ".join(draw(st.lists(_word, min_size=1, max_size=6)))
        else:
            kw[name] = draw(_word)
    return SnapshotKey(**kw)  # type: ignore[arg-type]
