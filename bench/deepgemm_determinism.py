r"""How deterministic DeepGEMM's JIT is (issue 42 item 1), the one cache kind no bake of the
reference model reaches: the FP8 block-scaled GEMMs vLLM's DeepGEMM warm-up compiles for the FP8
MoE's dense layers, compiled twice, each time in a fresh process with an empty
``DG_JIT_CACHE_DIR``, and the two caches compared file by file (paths, sha256) as
``bench/vllm_capture.py --rebake`` compares two bakes. Two minutes where a whole FP8 MoE rebake
takes two bakes of nine.

    python3 bench/deepgemm_determinism.py --out "$RUN_OUT"        # on the GPU, e.g.
    bash bench/device.sh start dg -- bash -c "python3 bench/deepgemm_determinism.py --out \$RUN_OUT"

Each compile calls ``vllm.utils.deep_gemm.fp8_gemm_nt`` as
``vllm/model_executor/warmup/deep_gemm_warmup.py`` does (FP8 activations, float32 per-128
scales left zero, bf16 out), for the attention projections of Qwen3-30B-A3B FP8
(``shared/gpu-testenv/qwen3-30b-a3b-fp8-config.json``: hidden 2048, 32 query and 4 KV heads of
128) and a few token counts. The grouped MoE GEMMs (``m_grouped_fp8_gemm_nt_contiguous``) are
not compiled here. Writes ``deepgemm-determinism.json`` into ``--out`` and prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_capture import determinism, sha256  # bench/ scripts import their siblings so

# (n, k) of the weights: qkv_proj ((32 + 2 * 4) * 128, 2048) and o_proj (2048, 32 * 128).
SHAPES = ((5120, 2048), (2048, 4096))
TOKENS = (1, 16, 128, 1024)
# DeepGEMM's scale block along k (vLLM's get_mk_alignment_for_contiguous_layout on Hopper).
BLOCK = 128
KIND = "deep_gemm"
CHILD_TIMEOUT_S = 600
# How much of a failed compile's output the document keeps.
TAIL = 2000

CHILD = r"""
import json, sys, time
import torch
from vllm.utils import deep_gemm as dg
shapes, tokens, block = json.loads(sys.argv[1])
if not dg.is_deep_gemm_supported():
    print(json.dumps({"supported": False}))
    sys.exit(3)
t = time.monotonic()
for n, k in shapes:
    w = torch.zeros((n, k), device="cuda", dtype=torch.float8_e4m3fn)
    ws = torch.ones((n // block, k // block), device="cuda", dtype=torch.float32)
    for m in tokens:
        a = torch.zeros((m, k), device="cuda", dtype=torch.float8_e4m3fn)
        a_s = torch.zeros((m, k // block), device="cuda", dtype=torch.float32)
        out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        dg.fp8_gemm_nt((a, a_s), (w, ws), out)
torch.cuda.synchronize()
print(json.dumps({"supported": True, "gemm_s": round(time.monotonic() - t, 2)}))
"""


def hashes(root: Path) -> dict[str, str]:
    """Every file below ``root`` (its path under ``KIND/``): its sha256."""
    out: dict[str, str] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            out[f"{KIND}/{path.relative_to(root).as_posix()}"] = sha256(path)
    return out


def compile_once(cache: Path, env: dict[str, str]) -> dict[str, Any]:
    """One fresh process compiling every shape into the empty ``cache``: how it went."""
    cache.mkdir(parents=True)
    t = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps([SHAPES, TOKENS, BLOCK])],
            env={**env, "DG_JIT_CACHE_DIR": str(cache)},
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"rc": None, "seconds": CHILD_TIMEOUT_S, "error": f"timed out after {CHILD_TIMEOUT_S} s"}
    run: dict[str, Any] = {"rc": proc.returncode, "seconds": round(time.monotonic() - t, 2)}
    lines = proc.stdout.strip().splitlines()
    said: Any = None
    with contextlib.suppress(json.JSONDecodeError):
        said = json.loads(lines[-1]) if lines else None
    if isinstance(said, dict):
        run.update(said)
    if proc.returncode != 0:
        run["error"] = (proc.stdout + proc.stderr)[-TAIL:]
    return run


def summary(runs: list[dict[str, Any]], per_kind: dict[str, Any]) -> dict[str, Any]:
    """The verdict: measured only when both compiles ran and wrote files."""
    mine = per_kind.get(KIND) or {}
    measured = all(r.get("rc") == 0 for r in runs) and bool(mine.get("first_files"))
    return {
        "measured": measured,
        "files": mine.get("first_files"),
        "same_paths": mine.get("same_paths"),
        "same_bytes": mine.get("same_bytes"),
        "deterministic": (
            mine["same_bytes"] == mine["first_files"] == mine["second_files"] if measured else None
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="deepgemm-determinism-") as tmp:
        caches = [Path(tmp, "first"), Path(tmp, "second")]
        runs = [compile_once(c, env) for c in caches]
        first, second = (hashes(c) for c in caches)
    per_kind = determinism(first, second, ("first", "second"))
    doc = {
        "bench": "deepgemm_determinism",
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "shapes_n_k": SHAPES,
        "tokens": TOKENS,
        "runs": runs,
        "determinism": per_kind,
        "summary": summary(runs, per_kind),
    }
    text = json.dumps(doc, indent=1)
    (a.out / "deepgemm-determinism.json").write_text(text + "\n")
    print(text)
    return 0 if doc["summary"]["measured"] else 1


if __name__ == "__main__":
    sys.exit(main())
