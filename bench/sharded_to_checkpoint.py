"""vLLM's sharded state of a dense decoder written back in the checkpoint's layout, stdlib only.

Why: a snapshot that leaves the weights out reloads them after the restore with vLLM's
``reload_weights``. From vLLM 0.32 that call reads through the load format's ``get_all_weights``,
which ``sharded_state`` (what ``save_sharded_state`` writes, and the only way to get the baked
server's dummy weights out of it) and ``dummy`` do not have: the reload fails with
``NotImplementedError: Model reloading with `sharded_state` format``. A checkpoint in the layout
a model is published in loads through the default loader, as a user's real weights do, so the
bench's restores take the user's path and still serve the baked start's weights (the same bytes).

The sharded state holds vLLM's fused tensors (``qkv_proj`` = q, k and v stacked along rows,
``gate_up_proj`` = gate and up): splitting a row-major tensor along its first dimension is
cutting its bytes into consecutive ranges, so no tensor library is needed. A layout this does not
know (mixture-of-experts ``experts.w13_weight``, quantisation scales of fused tensors) is refused
with a ValueError: the flow then keeps the weights inside the snapshot.

    python3 bench/sharded_to_checkpoint.py MODEL_DIR     # in place; prints JSON
"""

from __future__ import annotations

import json
import mmap
import re
import struct
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

SHARDED = "model-rank-*-part-*.safetensors"
_FUSED = re.compile(r"\.(qkv_proj|gate_up_proj)\.(weight|bias)$")
# Fused tensors whose parts this cannot name from the config alone.
_UNKNOWN = re.compile(r"\.experts\.|\.w13_|\.w2_|weight_scale|input_scale|\.qweight|\.qzeros")
# The attention layer's scale buffers (vLLM registers them, persistent, at 1.0 when the KV cache
# is not quantised): in the state dict, never in a checkpoint, whose loader has no parameter of
# that name. Left out when they hold 1.0; another value is a quantised cache this does not know.
_DEFAULT_BUFFER = re.compile(r"\.attn\._(k|v|q|prob)_scale$")
_F32_ONE = struct.pack("<f", 1.0)


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header and where its data starts."""
    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > 100 << 20:
            raise ValueError(f"{path}: header of {n} bytes is not a safetensors header")
        return json.loads(fh.read(n)), 8 + n


def encode_header(tensors: Iterable[tuple[str, str, Sequence[int], int]]) -> bytes:
    """The length-prefixed safetensors header of ``(name, dtype, shape, bytes)`` laid end to end
    in this order, padded with spaces to 8 bytes as safetensors writes it (the data stays aligned)."""
    meta: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, dtype, shape, nbytes in tensors:
        meta[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + nbytes]}
        at += nbytes
    raw = json.dumps(meta, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def parts(config: Mapping[str, Any]) -> dict[str, list[tuple[str, int]]]:
    """Each fused module's parts and their rows, from the model's config.json."""
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    inter = int(config["intermediate_size"])
    return {
        "qkv_proj": [("q_proj", heads * head_dim), ("k_proj", kv * head_dim), ("v_proj", kv * head_dim)],
        "gate_up_proj": [("gate_proj", inter), ("up_proj", inter)],
    }


def refuses(config: Mapping[str, Any]) -> str | None:
    """Why ``convert`` would refuse this model's sharded state, told from its config.json alone
    (None: a dense, unquantised decoder it splits): the flow then need not save ~30 GB first."""
    if int(config.get("num_experts") or 0):
        return "mixture of experts: vLLM's fused experts (w13/w2) are shuffled per kernel backend"
    if config.get("quantization_config"):
        return "quantised: the fused tensors' scales are not split here"
    return None


def split(
    name: str, meta: Mapping[str, Any], layout: Mapping[str, list[tuple[str, int]]]
) -> Iterator[tuple[str, dict[str, Any], int, int]]:
    """(new name, header entry, begin, end) of each part of one tensor, offsets within the file's
    data; an unfused tensor is its own one part."""
    begin, end = meta["data_offsets"]
    if _UNKNOWN.search(name):
        raise ValueError(f"{name}: a fused layout this cannot split (mixture of experts or quantised)")
    m = _FUSED.search(name)
    if m is None:
        yield name, {"dtype": meta["dtype"], "shape": meta["shape"]}, begin, end
        return
    shape = list(meta["shape"])
    rows = [r for _, r in layout[m.group(1)]]
    if shape[0] != sum(rows):
        raise ValueError(f"{name}: {shape[0]} rows, the config says {sum(rows)} ({rows})")
    row_bytes = (end - begin) // shape[0]
    at = begin
    for part, r in layout[m.group(1)]:
        new = name[: m.start()] + f".{part}.{m.group(2)}"
        yield new, {"dtype": meta["dtype"], "shape": [r, *shape[1:]]}, at, at + r * row_bytes
        at += r * row_bytes


def convert_file(src: Path, dest: Path, layout: Mapping[str, list[tuple[str, int]]]) -> int:
    """``src`` (sharded state) as ``dest`` (checkpoint layout); how many tensors were split."""
    header, data_at = read_header(src)
    header.pop("__metadata__", None)
    pieces: list[tuple[str, dict[str, Any], int, int]] = []
    fused = 0
    for name in sorted(header, key=lambda n: header[n]["data_offsets"][0]):
        if _DEFAULT_BUFFER.search(name):
            begin, end = header[name]["data_offsets"]
            with src.open("rb") as fh:
                fh.seek(data_at + begin)
                if header[name]["dtype"] != "F32" or fh.read(end - begin) != _F32_ONE:
                    raise ValueError(f"{name}: a scale other than 1.0 (a quantised KV cache)")
            continue
        got = list(split(name, header[name], layout))
        fused += len(got) > 1
        pieces.extend(got)
    header_bytes = encode_header((n, e["dtype"], e["shape"], end - begin) for n, e, begin, end in pieces)
    with src.open("rb") as fin, dest.open("wb") as fout:
        fout.write(header_bytes)
        with mmap.mmap(fin.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            for _, _, begin, end in pieces:
                step = 256 << 20
                for a in range(data_at + begin, data_at + end, step):
                    fout.write(mm[a : min(a + step, data_at + end)])
    return fused


def convert(model: Path) -> dict[str, Any]:
    """Every sharded-state file of ``model`` replaced by one in the checkpoint's layout. All or
    nothing: a file this cannot convert leaves the sharded files and removes what it wrote."""
    sharded = sorted(model.glob(SHARDED))
    if not sharded:
        raise ValueError(f"{model}: no {SHARDED}")
    layout = parts(json.loads((model / "config.json").read_text()))
    written: list[Path] = []
    fused = 0
    try:
        for i, src in enumerate(sharded, 1):
            dest = model / f"model-{i:05d}-of-{len(sharded):05d}.safetensors"
            written.append(dest)
            fused += convert_file(src, dest, layout)
    except BaseException:
        for p in written:
            p.unlink(missing_ok=True)
        raise
    for src in sharded:
        src.unlink()
    return {"files": len(written), "bytes": sum(p.stat().st_size for p in written), "split": fused}


if __name__ == "__main__":
    print(json.dumps(convert(Path(sys.argv[1]))))
