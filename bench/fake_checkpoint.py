"""A checkpoint in the Hugging Face layout made up from a model's config.json, stdlib only.

Why: a snapshot that leaves the weights out reloads them after the restore with vLLM's
``reload_weights``, which on vLLM 0.32 reads the model directory through the default loader: the
directory must hold a checkpoint in the layout the model is published in. The bench models are
configs served with dummy weights. For a dense model bench/sharded_to_checkpoint.py turns the
baked server's saved state back into that layout; for the FP8 mixture of experts it cannot (vLLM
shuffles the fused expert tensors per kernel backend after loading). This writes the layout
directly instead: the tensor names, shapes and dtypes of the published checkpoint of the
architecture, with made-up values (deterministic from a seed, finite and small).

Names, as vLLM 0.32.0's loaders read them (models/qwen3.py, qwen3_moe.py, llama.py: the
``hf_to_vllm_mapper``/stacked mappings fuse ``q_proj``/``k_proj``/``v_proj`` and the dense MLP's
``gate_proj``/``up_proj``; fused_moe/routed_experts.py ``build_expert_params_mapping`` maps
``mlp.experts.{e}.{gate,up,down}_proj.`` onto ``w13_``/``w2_`` parameters, scales included).
FP8 block quantisation (``quant_method: fp8`` with ``weight_block_size``) as in the official
Qwen3-*-FP8 checkpoints: every linear layer vLLM builds with ``Fp8LinearMethod`` or
``Fp8MoEMethod`` (quantization/fp8.py ``Fp8Config.get_quant_method``: each ``LinearBase`` and
the routed experts, unless named in ``modules_to_not_convert``/``ignored_layers``) holds a
float8_e4m3fn ``weight`` and a float32 ``weight_scale_inv`` of [ceil(out/bn), ceil(in/bk)];
embeddings, norms and ``lm_head`` (a ``ParallelLMHead``, no ``LinearBase``) stay bf16. The MoE
router ``mlp.gate`` is a ``GateLinear`` (a ``LinearBase``): quantised unless the config leaves it
out, as the official configs do in ``modules_to_not_convert``.

Values: one pre-generated random block per dtype (``BLOCK_BYTES``), each tensor a window of it
repeated from an offset of its own, so tens of GB are written at the disk's speed. bf16 values
have magnitudes in [2^-13, 2^-5) (about ±0.02, at most 0.031); FP8 bytes have exponent fields
1..10 (magnitudes 2^-6 .. 15, never the NaN patterns 0x7f/0xff); every block scale is 2^-9, so
weight*scale stays below 0.03. An architecture, dtype or quantisation this does not know is
refused with a ValueError naming the field.

    python3 bench/fake_checkpoint.py MODEL_DIR [--seed N]    # writes into MODEL_DIR; prints JSON
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import shutil
import struct
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# The sibling that writes safetensors headers (stdlib too), found beside this script wherever it runs.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import sharded_to_checkpoint

INDEX = "model.safetensors.index.json"
SHARD_GLOB = "model-*-of-*.safetensors"
# transformers' default max_shard_size ("5GB", decimal).
SHARD_BYTES = 5_000_000_000
BLOCK_BYTES = 32 << 20
FP8_SCALE = 2.0**-9
ITEMSIZE = {"BF16": 2, "F8_E4M3": 1, "F32": 4}
DENSE = ("LlamaForCausalLM", "Qwen3ForCausalLM")
MOE = ("Qwen3MoeForCausalLM",)
QK_NORM = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
# The keys of an FP8 block quantisation_config this knows (the official Qwen3-*-FP8 ones and
# vLLM's Fp8Config.from_config names for the modules left out); any other changes the layout.
_FP8_KEYS = {
    "quant_method",
    "fmt",
    "activation_scheme",
    "weight_block_size",
    "modules_to_not_convert",
    "ignored_layers",
}
# Features of these architectures that add tensors this does not write.
_REFUSED_TRUE = ("attention_bias", "mlp_bias")


@dataclasses.dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


@dataclasses.dataclass(frozen=True)
class Quant:
    """FP8 block quantisation: the weight block, and the modules (HF names) left in bf16."""

    block: tuple[int, int]
    skipped: frozenset[str]


# The tensor list, from the config.


def _int(config: Mapping[str, Any], field: str, default: int | None = None) -> int:
    value = config.get(field, default)
    if value is None:
        if default is not None:
            return default
        raise ValueError(f"config.json: {field} is missing")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"config.json: {field} = {value!r} is not a count")
    return value


def architecture(config: Mapping[str, Any]) -> str:
    archs = config.get("architectures")
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in (*DENSE, *MOE):
        raise ValueError(f"config.json: architectures = {archs!r}; known: one of {[*DENSE, *MOE]}")
    dtype = config.get("torch_dtype", config.get("dtype", "bfloat16"))
    if dtype != "bfloat16":
        raise ValueError(f"config.json: torch_dtype = {dtype!r}; known: bfloat16")
    for field in _REFUSED_TRUE:
        if config.get(field):
            raise ValueError(f"config.json: {field} = {config[field]!r}; biases are not written")
    return str(archs[0])


def quantization(config: Mapping[str, Any]) -> Quant | None:
    """The config's FP8 block quantisation, None without one; any other refused."""
    q = config.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, Mapping) or q.get("quant_method") != "fp8":
        method = q.get("quant_method") if isinstance(q, Mapping) else q
        raise ValueError(f"config.json: quantization_config.quant_method = {method!r}; known: 'fp8'")
    if unknown := sorted(set(q) - _FP8_KEYS):
        raise ValueError(f"config.json: quantization_config.{unknown[0]}: not a field this knows")
    if q.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"config.json: quantization_config.fmt = {q['fmt']!r}; known: 'e4m3'")
    if q.get("activation_scheme", "dynamic") != "dynamic":
        raise ValueError(
            f"config.json: quantization_config.activation_scheme = {q['activation_scheme']!r}; known: 'dynamic'"
        )
    block = q.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        # Per-tensor FP8 has scalar weight_scale (and input_scale) tensors: another layout.
        raise ValueError(f"config.json: quantization_config.weight_block_size = {block!r}; known: [n, k]")
    skipped = q.get("modules_to_not_convert") or q.get("ignored_layers") or []
    if any(".experts." in m or m.endswith(".experts") for m in skipped):
        raise ValueError("config.json: quantization_config.modules_to_not_convert names experts; not known")
    return Quant((block[0], block[1]), frozenset(skipped))


def linear(name: str, out: int, inp: int, quant: Quant | None) -> list[Tensor]:
    """One linear layer's tensors: bf16 ``weight``, or FP8 ``weight`` and its block scales."""
    if quant is None or name in quant.skipped:
        return [Tensor(f"{name}.weight", "BF16", (out, inp))]
    bn, bk = quant.block
    return [
        Tensor(f"{name}.weight", "F8_E4M3", (out, inp)),
        Tensor(f"{name}.weight_scale_inv", "F32", (-(-out // bn), -(-inp // bk))),
    ]


def _fused(names: Sequence[str], quant: Quant | None) -> None:
    """vLLM loads these into one fused layer (is_layer_skipped): all left out or none."""
    if quant is not None and 0 < sum(n in quant.skipped for n in names) < len(names):
        raise ValueError(
            f"config.json: quantization_config.modules_to_not_convert names part of {list(names)}"
        )


def attention(prefix: str, config: Mapping[str, Any], arch: str, quant: Quant | None) -> list[Tensor]:
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    kv = _int(config, "num_key_value_heads", heads)
    head_dim = _int(config, "head_dim", hidden // heads)
    p = f"{prefix}.self_attn"
    _fused([f"{p}.q_proj", f"{p}.k_proj", f"{p}.v_proj"], quant)
    out = [
        *linear(f"{p}.q_proj", heads * head_dim, hidden, quant),
        *linear(f"{p}.k_proj", kv * head_dim, hidden, quant),
        *linear(f"{p}.v_proj", kv * head_dim, hidden, quant),
        *linear(f"{p}.o_proj", hidden, heads * head_dim, quant),
    ]
    if arch in QK_NORM:
        out += [
            Tensor(f"{p}.q_norm.weight", "BF16", (head_dim,)),
            Tensor(f"{p}.k_norm.weight", "BF16", (head_dim,)),
        ]
    return out


def mlp(prefix: str, hidden: int, inter: int, quant: Quant | None) -> list[Tensor]:
    """A SwiGLU MLP: a dense layer's ``mlp`` or one expert."""
    if not prefix.count(".experts."):
        _fused([f"{prefix}.gate_proj", f"{prefix}.up_proj"], quant)
    return [
        *linear(f"{prefix}.gate_proj", inter, hidden, quant),
        *linear(f"{prefix}.up_proj", inter, hidden, quant),
        *linear(f"{prefix}.down_proj", hidden, inter, quant),
    ]


def is_moe_layer(config: Mapping[str, Any], i: int) -> bool:
    """vLLM's Qwen3MoeDecoderLayer rule: experts unless in mlp_only_layers or off the step."""
    step = _int(config, "decoder_sparse_step", 1)
    only = config.get("mlp_only_layers") or []
    return i not in only and _int(config, "num_experts") > 0 and step > 0 and (i + 1) % step == 0


def moe(prefix: str, config: Mapping[str, Any], quant: Quant | None) -> list[Tensor]:
    if _int(config, "shared_expert_intermediate_size", 0):
        raise ValueError("config.json: shared_expert_intermediate_size: shared experts are not written")
    hidden = _int(config, "hidden_size")
    inter = _int(config, "moe_intermediate_size")
    out = linear(f"{prefix}.mlp.gate", _int(config, "num_experts"), hidden, quant)
    for e in range(_int(config, "num_experts")):
        out += mlp(f"{prefix}.mlp.experts.{e}", hidden, inter, quant)
    return out


def tensors(config: Mapping[str, Any]) -> list[Tensor]:
    """The checkpoint's tensors, in the order of the model (names as published)."""
    arch = architecture(config)
    quant = quantization(config)
    hidden = _int(config, "hidden_size")
    vocab = _int(config, "vocab_size")
    out = [Tensor("model.embed_tokens.weight", "BF16", (vocab, hidden))]
    for i in range(_int(config, "num_hidden_layers")):
        p = f"model.layers.{i}"
        out.append(Tensor(f"{p}.input_layernorm.weight", "BF16", (hidden,)))
        out += attention(p, config, arch, quant)
        out.append(Tensor(f"{p}.post_attention_layernorm.weight", "BF16", (hidden,)))
        if arch in MOE and is_moe_layer(config, i):
            out += moe(p, config, quant)
        else:
            out += mlp(f"{p}.mlp", hidden, _int(config, "intermediate_size"), quant)
    out.append(Tensor("model.norm.weight", "BF16", (hidden,)))
    if not config.get("tie_word_embeddings", False):
        out.append(Tensor("lm_head.weight", "BF16", (vocab, hidden)))
    return out


def shards(ts: Sequence[Tensor], limit: int = SHARD_BYTES) -> list[list[Tensor]]:
    """Consecutive tensors grouped into files of at most ``limit`` bytes of data (one larger
    tensor alone in its file), as transformers' save_pretrained shards."""
    out: list[list[Tensor]] = [[]]
    size = 0
    for t in ts:
        if out[-1] and size + t.nbytes > limit:
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.nbytes
    return out


# The values.

# bf16's high byte: the sign and the exponent's top 7 bits, so that the exponent (its low bit
# from the low byte, random) is 114..121: magnitudes 2^-13 .. 2^-5.
_BF16_HIGH = bytes((r & 0x80) | (57 + (r & 3)) for r in range(256))
# e4m3fn: the sign, an exponent field of 1..10 (never 15, where 0x7f/0xff are NaN), the mantissa.
_FP8 = bytes((r & 0x80) | ((1 + ((r >> 3) & 0xF) % 10) << 3) | (r & 7) for r in range(256))


def blocks(seed: int, size: int = BLOCK_BYTES) -> dict[str, bytes]:
    """Per dtype, ``size`` bytes of values twice over (any window of ``size`` is contiguous)."""
    rng = random.Random(seed)
    bf16 = bytearray(size)
    bf16[0::2] = rng.randbytes(size // 2)
    bf16[1::2] = rng.randbytes(size // 2).translate(_BF16_HIGH)
    fp8 = rng.randbytes(size).translate(_FP8)
    f32 = struct.pack("<f", FP8_SCALE) * (size // 4)
    return {"BF16": bytes(bf16) * 2, "F8_E4M3": fp8 * 2, "F32": f32 * 2}


def _offset(name: str, itemsize: int, size: int) -> int:
    """Where a tensor's values start in its block: its own window, aligned to its items."""
    return (zlib.crc32(name.encode()) % (size // itemsize)) * itemsize


def header(ts: Sequence[Tensor]) -> bytes:
    return sharded_to_checkpoint.encode_header((t.name, t.dtype, t.shape, t.nbytes) for t in ts)


def write_file(path: Path, ts: Sequence[Tensor], vals: Mapping[str, bytes]) -> int:
    """One safetensors file of ``ts``, written beside ``path`` and renamed into it."""
    partial = path.with_name(f".{path.name}.partial")
    written = 0
    with partial.open("wb") as fh:
        written += fh.write(header(ts))
        for t in ts:
            block = memoryview(vals[t.dtype])
            size = len(block) // 2
            at = _offset(t.name, ITEMSIZE[t.dtype], size)
            left = t.nbytes
            while left:
                n = min(left, size)
                written += fh.write(block[at : at + n])
                left -= n
    partial.rename(path)
    return written


def write(model: Path, seed: int = 0, limit: int = SHARD_BYTES) -> dict[str, Any]:
    """The checkpoint of ``model``'s config.json written into ``model`` (its earlier
    ``model-*-of-*.safetensors`` and index replaced): files, tensors, bytes and seconds."""
    t0 = time.monotonic()
    ts = tensors(json.loads((model / "config.json").read_text()))
    groups = shards(ts, limit)
    total = sum(t.nbytes for t in ts)
    free = shutil.disk_usage(model).free + sum(p.stat().st_size for p in model.glob(SHARD_GLOB))
    if free < total + (1 << 30):
        raise OSError(f"{model}: {total} bytes of weights to write, {free} free")
    for p in model.glob(SHARD_GLOB):
        p.unlink()
    (model / INDEX).unlink(missing_ok=True)
    vals = blocks(seed)
    written = 0
    weight_map: dict[str, str] = {}
    for k, group in enumerate(groups, 1):
        name = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        written += write_file(model / name, group, vals)
        weight_map.update((t.name, name) for t in group)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (model / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    s = time.monotonic() - t0
    return {
        "files": len(groups),
        "tensors": len(ts),
        "bytes": written,
        "seed": seed,
        "s": round(s, 2),
        "gb_per_s": round(written / 1e9 / s, 2) if s else None,
    }


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, help="the model directory, with its config.json")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(json.dumps(write(a.model, a.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
