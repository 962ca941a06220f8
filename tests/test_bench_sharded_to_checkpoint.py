"""bench/sharded_to_checkpoint.py: vLLM's fused tensors cut back into the checkpoint's parts,
byte for byte, the attention's default scale buffers left out, unknown layouts refused whole."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests.support import bench

conv = bench.load("sharded_to_checkpoint")

CONFIG = {
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 2,
    "hidden_size": 8,
    "intermediate_size": 3,
}


def write(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        at += len(data)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(d for _, _, d in tensors.values()))


def read(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    header, at = conv.read_header(path)
    body = path.read_bytes()[at:]
    header.pop("__metadata__")
    return {
        n: (m["dtype"], m["shape"], body[m["data_offsets"][0] : m["data_offsets"][1]])
        for n, m in header.items()
    }


def rows(n: int, width: int, tag: int) -> bytes:
    """n rows of ``width`` bf16 values, every byte naming its tensor and row."""
    return b"".join(bytes([tag, r]) * width for r in range(n))


def model(tmp_path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    write(tmp_path / "model-rank-0-part-0.safetensors", tensors)
    return tmp_path


def test_fused_tensors_split_into_the_checkpoint_parts(tmp_path: Path) -> None:
    # q: 4 heads x 2 = 8 rows, k and v: 2 x 2 = 4 rows each; gate and up: 3 rows each.
    qkv = rows(16, 8, 1)
    gate_up = rows(6, 8, 2)
    norm = bytes(range(16))
    one = struct.pack("<f", 1.0)
    m = model(
        tmp_path,
        {
            "model.layers.0.self_attn.qkv_proj.weight": ("BF16", [16, 8], qkv),
            "model.layers.0.self_attn.attn._k_scale": ("F32", [], one),
            "model.layers.0.mlp.gate_up_proj.weight": ("BF16", [6, 8], gate_up),
            "model.norm.weight": ("BF16", [8], norm),
        },
    )
    assert conv.convert(m) == {
        "files": 1,
        "bytes": (m / "model-00001-of-00001.safetensors").stat().st_size,
        "split": 2,
    }
    assert not list(m.glob(conv.SHARDED))
    got = read(m / "model-00001-of-00001.safetensors")
    row = 16  # bytes of one row of 8 bf16 values
    assert got == {
        "model.layers.0.self_attn.q_proj.weight": ("BF16", [8, 8], qkv[: 8 * row]),
        "model.layers.0.self_attn.k_proj.weight": ("BF16", [4, 8], qkv[8 * row : 12 * row]),
        "model.layers.0.self_attn.v_proj.weight": ("BF16", [4, 8], qkv[12 * row :]),
        "model.layers.0.mlp.gate_proj.weight": ("BF16", [3, 8], gate_up[: 3 * row]),
        "model.layers.0.mlp.up_proj.weight": ("BF16", [3, 8], gate_up[3 * row :]),
        "model.norm.weight": ("BF16", [8], norm),
    }


@pytest.mark.parametrize(
    ("name", "entry", "why"),
    [
        ("model.layers.0.mlp.experts.w13_weight", ("BF16", [2, 8], rows(2, 8, 3)), "mixture of experts"),
        ("model.layers.0.self_attn.qkv_proj.weight", ("BF16", [15, 8], rows(15, 8, 1)), "the config says 16"),
        ("model.layers.0.self_attn.attn._v_scale", ("F32", [], struct.pack("<f", 0.5)), "other than 1.0"),
    ],
)
def test_an_unknown_layout_is_refused_and_nothing_is_left_half_written(
    tmp_path: Path, name: str, entry: tuple[str, list[int], bytes], why: str
) -> None:
    m = model(tmp_path, {name: entry})
    before = (m / "model-rank-0-part-0.safetensors").read_bytes()
    with pytest.raises(ValueError, match=why):
        conv.convert(m)
    assert sorted(p.name for p in m.iterdir()) == ["config.json", "model-rank-0-part-0.safetensors"]
    assert (m / "model-rank-0-part-0.safetensors").read_bytes() == before


def test_what_convert_refuses_is_told_from_the_config_alone() -> None:
    assert conv.refuses(CONFIG) is None
    assert "mixture of experts" in (conv.refuses({**CONFIG, "num_experts": 128}) or "")
    assert "quantised" in (conv.refuses({**CONFIG, "quantization_config": {"quant_method": "fp8"}}) or "")
    dense = json.loads((Path(__file__).parents[1] / "bench/models/qwen3-8b-dummy/config.json").read_text())
    assert conv.refuses(dense) is None
    moe = json.loads(
        (Path(__file__).parents[1] / "bench/models/qwen3-30b-a3b-fp8-dummy/config.json").read_text()
    )
    assert conv.refuses(moe) is not None
