"""bench/fake_checkpoint.py: from a config.json, the Hugging Face checkpoint's tensor names, shapes
and dtypes (the expected lists below are written out from the published naming, not computed by
the code under test), an index that maps every tensor, FP8 bytes that are never NaN, the same
bytes for the same seed, and a refusal of what it does not know."""

from __future__ import annotations

import json
import math
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.support import bench

fc = bench.load("fake_checkpoint")


DENSE = {
    "hidden_size": 256,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 512,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "torch_dtype": "bfloat16",
}
QWEN3 = {**DENSE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "tie_word_embeddings": True}
# Llama's head_dim from hidden_size / heads (64), untied lm_head.
LLAMA = {
    **{k: v for k, v in DENSE.items() if k != "head_dim"},
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "tie_word_embeddings": False,
}
MOE = {
    **DENSE,
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 192,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "tie_word_embeddings": False,
}
FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


def _layer(
    i: int, attn: list[tuple[str, str, list[int]]], mlp: list[tuple[str, str, list[int]]]
) -> list[Any]:
    p = f"model.layers.{i}."
    return [
        (p + "input_layernorm.weight", "BF16", [256]),
        *[(p + n, d, s) for n, d, s in attn],
        (p + "post_attention_layernorm.weight", "BF16", [256]),
        *[(p + n, d, s) for n, d, s in mlp],
    ]


# q: 4 heads x 64 = 256 rows; k, v: 2 x 64 = 128 rows; o: 256 x 256.
ATTN_BF16 = [
    ("self_attn.q_proj.weight", "BF16", [256, 256]),
    ("self_attn.k_proj.weight", "BF16", [128, 256]),
    ("self_attn.v_proj.weight", "BF16", [128, 256]),
    ("self_attn.o_proj.weight", "BF16", [256, 256]),
]
QK_NORM = [("self_attn.q_norm.weight", "BF16", [64]), ("self_attn.k_norm.weight", "BF16", [64])]
MLP_BF16 = [
    ("mlp.gate_proj.weight", "BF16", [384, 256]),
    ("mlp.up_proj.weight", "BF16", [384, 256]),
    ("mlp.down_proj.weight", "BF16", [256, 384]),
]
# FP8 blocks of 128 x 128: scales of [ceil(out/128), ceil(in/128)].
ATTN_FP8 = [
    ("self_attn.q_proj.weight", "F8_E4M3", [256, 256]),
    ("self_attn.q_proj.weight_scale_inv", "F32", [2, 2]),
    ("self_attn.k_proj.weight", "F8_E4M3", [128, 256]),
    ("self_attn.k_proj.weight_scale_inv", "F32", [1, 2]),
    ("self_attn.v_proj.weight", "F8_E4M3", [128, 256]),
    ("self_attn.v_proj.weight_scale_inv", "F32", [1, 2]),
    ("self_attn.o_proj.weight", "F8_E4M3", [256, 256]),
    ("self_attn.o_proj.weight_scale_inv", "F32", [2, 2]),
]


def _experts(router: list[Any]) -> list[Any]:
    out = list(router)
    for e in range(4):
        out += [
            (f"mlp.experts.{e}.gate_proj.weight", "F8_E4M3", [192, 256]),
            (f"mlp.experts.{e}.gate_proj.weight_scale_inv", "F32", [2, 2]),
            (f"mlp.experts.{e}.up_proj.weight", "F8_E4M3", [192, 256]),
            (f"mlp.experts.{e}.up_proj.weight_scale_inv", "F32", [2, 2]),
            (f"mlp.experts.{e}.down_proj.weight", "F8_E4M3", [256, 192]),
            (f"mlp.experts.{e}.down_proj.weight_scale_inv", "F32", [2, 2]),
        ]
    return out


ROUTER_BF16 = [("mlp.gate.weight", "BF16", [4, 256])]
ROUTER_FP8 = [("mlp.gate.weight", "F8_E4M3", [4, 256]), ("mlp.gate.weight_scale_inv", "F32", [1, 2])]
EMBED = [("model.embed_tokens.weight", "BF16", [512, 256])]
TAIL = [("model.norm.weight", "BF16", [256])]
LM_HEAD = [("lm_head.weight", "BF16", [512, 256])]

EXPECTED = {
    "qwen3": EMBED
    + _layer(0, ATTN_BF16 + QK_NORM, MLP_BF16)
    + _layer(1, ATTN_BF16 + QK_NORM, MLP_BF16)
    + TAIL,
    "llama": EMBED + _layer(0, ATTN_BF16, MLP_BF16) + _layer(1, ATTN_BF16, MLP_BF16) + TAIL + LM_HEAD,
    # As the official Qwen3-*-FP8 configs: routers and lm_head in modules_to_not_convert.
    "moe-fp8": EMBED
    + _layer(0, ATTN_FP8 + QK_NORM, _experts(ROUTER_BF16))
    + _layer(1, ATTN_FP8 + QK_NORM, _experts(ROUTER_BF16))
    + TAIL
    + LM_HEAD,
}
CONFIGS = {
    "qwen3": QWEN3,
    "llama": LLAMA,
    "moe-fp8": {
        **MOE,
        "quantization_config": {
            **FP8,
            "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"],
        },
    },
}


def _model(tmp_path: Path, config: dict[str, Any], name: str = "m") -> Path:
    model = tmp_path / name
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return model


def _read(model: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """Every tensor of the checkpoint, through its index and its files' headers."""
    index = json.loads((model / fc.INDEX).read_text())
    out: dict[str, tuple[str, list[int], bytes]] = {}
    for file in sorted(set(index["weight_map"].values())):
        raw = (model / file).read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        assert header.pop("__metadata__") == {"format": "pt"}
        end = 0
        for name, meta in header.items():
            a, b = meta["data_offsets"]
            size = math.prod(meta["shape"]) * {"BF16": 2, "F8_E4M3": 1, "F32": 4}[meta["dtype"]]
            assert b - a == size and a == end, name  # contiguous, each its own size
            end = b
            assert index["weight_map"][name] == file
            out[name] = (meta["dtype"], meta["shape"], raw[8 + n + a : 8 + n + b])
        assert 8 + n + end == len(raw), file
    assert set(index["weight_map"]) == set(out)
    assert index["metadata"]["total_size"] == sum(len(d) for _, _, d in out.values())
    return out


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_the_checkpoint_has_the_published_names_shapes_and_dtypes(tmp_path: Path, kind: str) -> None:
    model = _model(tmp_path, CONFIGS[kind])
    report = fc.write(model, seed=1)
    got = _read(model)
    assert [(n, d, s) for n, (d, s, _) in got.items()] == [(n, d, s) for n, d, s in EXPECTED[kind]]
    assert report["tensors"] == len(EXPECTED[kind]) and report["files"] == 1
    assert sorted(p.name for p in model.iterdir()) == [
        "config.json",
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
    ]


def test_without_modules_to_not_convert_vllm_quantises_the_router_so_it_is_fp8(tmp_path: Path) -> None:
    # vLLM 0.32's Fp8Config.get_quant_method gives every LinearBase (GateLinear is one) the FP8
    # method unless the config names it: a bf16 router there would be cast with unset scales.
    model = _model(tmp_path, {**MOE, "quantization_config": FP8})
    fc.write(model)
    got = _read(model)
    for name, dtype, shape in ROUTER_FP8:
        assert got[f"model.layers.1.{name}"][:2] == (dtype, shape)
    assert got["lm_head.weight"][0] == "BF16" and got["model.norm.weight"][0] == "BF16"


def test_mlp_only_layers_and_the_sparse_step_keep_dense_mlps(tmp_path: Path) -> None:
    config = {**MOE, "num_hidden_layers": 3, "mlp_only_layers": [0], "decoder_sparse_step": 1}
    names = {t.name for t in fc.tensors(config)}
    assert "model.layers.0.mlp.gate_proj.weight" in names and "model.layers.0.mlp.gate.weight" not in names
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in names
    stepped = {t.name for t in fc.tensors({**MOE, "num_hidden_layers": 2, "decoder_sparse_step": 2})}
    assert "model.layers.0.mlp.up_proj.weight" in stepped and "model.layers.1.mlp.gate.weight" in stepped


def test_values_are_small_finite_and_fp8_never_nan(tmp_path: Path) -> None:
    model = _model(tmp_path, {**MOE, "quantization_config": FP8})
    fc.write(model)
    for name, (dtype, _, data) in _read(model).items():
        if dtype == "F8_E4M3":
            assert b"\x7f" not in data and b"\xff" not in data, name
            exponents = {(b >> 3) & 0xF for b in data}
            assert exponents <= set(range(1, 11)), name  # |w| <= 15
        elif dtype == "F32":
            assert set(struct.unpack(f"<{len(data) // 4}f", data)) == {2.0**-9}, name
        else:
            values = [
                struct.unpack("<f", b"\0\0" + data[i : i + 2])[0] for i in range(0, min(len(data), 4096), 2)
            ]
            assert all(2.0**-13 <= abs(v) < 2.0**-5 for v in values), name
    # weight * scale stays below 15 * 2^-9 < 0.03.
    assert 15 * fc.FP8_SCALE < 0.03


def test_the_same_seed_gives_the_same_bytes_and_another_seed_others(tmp_path: Path) -> None:
    config = {**MOE, "quantization_config": FP8}
    a, b, c = (_model(tmp_path, config, n) for n in "abc")
    fc.write(a, seed=7)
    fc.write(b, seed=7)
    fc.write(c, seed=8)
    file = "model-00001-of-00001.safetensors"
    assert (a / file).read_bytes() == (b / file).read_bytes()
    assert (a / file).read_bytes() != (c / file).read_bytes()
    got = _read(a)
    # Tensors of one shape are not all the same window of the block.
    assert (
        got["model.layers.0.mlp.experts.0.up_proj.weight"][2]
        != got["model.layers.0.mlp.experts.1.up_proj.weight"][2]
    )


def test_shards_stay_under_the_limit_and_a_rewrite_replaces_them(tmp_path: Path) -> None:
    model = _model(tmp_path, LLAMA)
    report = fc.write(model, limit=200_000)
    files = sorted(p.name for p in model.glob("model-*.safetensors"))
    assert len(files) == report["files"] > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    for p in model.glob("model-*.safetensors"):
        header_len = struct.unpack("<Q", p.read_bytes()[:8])[0]
        # A file over the limit holds one tensor alone (the 256 KiB embedding here).
        assert (
            p.stat().st_size - 8 - header_len <= 200_000
            or len(json.loads(p.read_bytes()[8 : 8 + header_len])) == 2
        )
    _read(model)
    fc.write(model)
    assert sorted(p.name for p in model.glob("model-*.safetensors")) == ["model-00001-of-00001.safetensors"]
    _read(model)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"architectures": ["MixtralForCausalLM"]}, "architectures"),
        ({"architectures": ["Qwen3ForCausalLM", "LlamaForCausalLM"]}, "architectures"),
        ({"torch_dtype": "float16"}, "torch_dtype"),
        ({"attention_bias": True}, "attention_bias"),
        ({"quantization_config": {"quant_method": "awq"}}, "quant_method"),
        ({"quantization_config": {**FP8, "weight_block_size": None}}, "weight_block_size"),
        ({"quantization_config": {**FP8, "fmt": "e5m2"}}, "fmt"),
        ({"quantization_config": {**FP8, "activation_scheme": "static"}}, "activation_scheme"),
        ({"quantization_config": {**FP8, "store_dtype": "mxfp4"}}, "store_dtype"),
        (
            {"quantization_config": {**FP8, "modules_to_not_convert": ["model.layers.0.self_attn.q_proj"]}},
            "q_proj",
        ),
        ({"shared_expert_intermediate_size": 64}, "shared_expert_intermediate_size"),
        ({"num_experts": None}, "num_experts"),
    ],
)
def test_what_it_does_not_know_is_refused_naming_the_field(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    model = _model(tmp_path, {**MOE, **change})
    with pytest.raises(ValueError, match=field):
        fc.write(model)
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]


def test_too_little_disk_is_refused_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(tmp_path, QWEN3)
    monkeypatch.setattr(fc.shutil, "disk_usage", lambda _p: type("U", (), {"free": 1000})())
    with pytest.raises(OSError, match="free"):
        fc.write(model)
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]


# The Hugging Face stack the generated files are checked with runs in an environment of its own
# (torch's CPU build, safetensors, transformers, accelerate: `scripts/deps.sh test` makes it), so
# that the host's .venv never holds torch, which host code must not import.
HF_PYTHON = REPO / ".venv-hf" / "bin" / "python"

_READ = """
import json, sys, torch
from safetensors import safe_open
path, expected = sys.argv[1], json.loads(sys.argv[2])
dtypes = {"BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn, "F32": torch.float32}
with safe_open(path, framework="pt") as f:
    assert list(f.keys()) == sorted(n for n, _, _ in expected), list(f.keys())
    for name, dtype, shape in expected:
        t = f.get_tensor(name)
        assert (t.dtype, list(t.shape)) == (dtypes[dtype], shape), name
        assert torch.isfinite(t.float()).all() and t.float().abs().max() <= 15, name
print("read", len(expected))
"""

_LOAD = """
import sys, torch
from transformers import AutoModelForCausalLM
model, architecture = sys.argv[1], sys.argv[2]
loaded, info = AutoModelForCausalLM.from_pretrained(model, output_loading_info=True, dtype=torch.bfloat16)
assert type(loaded).__name__ == architecture, type(loaded).__name__
assert {k: sorted(v) for k, v in info.items() if v} == {}, info
out = loaded(torch.tensor([[1, 2, 3, 4]])).logits
assert out.shape == (1, 4, 512) and torch.isfinite(out.float()).all(), out.shape
print("loaded", architecture)
"""


def _hf(script: str, *args: str) -> str:
    if not HF_PYTHON.exists():
        pytest.fail(f"{HF_PYTHON} is missing: run scripts/deps.sh test (make test-deps)")
    done = subprocess.run(
        [str(HF_PYTHON), "-c", script, *args], capture_output=True, text=True, check=False, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.hf
@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_the_real_safetensors_library_reads_it(tmp_path: Path, kind: str) -> None:
    model = _model(tmp_path, CONFIGS[kind])
    fc.write(model)
    shard = model / "model-00001-of-00001.safetensors"
    assert _hf(_READ, str(shard), json.dumps(EXPECTED[kind])) == f"read {len(EXPECTED[kind])}\n"


@pytest.mark.hf
@pytest.mark.parametrize("kind", ["qwen3", "llama", "moe-bf16", "moe-fp8"])
def test_transformers_loads_the_checkpoints_with_no_key_missing_or_unexpected(
    tmp_path: Path, kind: str
) -> None:
    config = MOE if kind == "moe-bf16" else CONFIGS[kind]
    model = _model(tmp_path, config)
    fc.write(model)
    architecture = config["architectures"][0]
    assert _hf(_LOAD, str(model), architecture) == f"loaded {architecture}\n"
