"""Issue 34's result: launch → /health of a baked start against its cold start and an
earlier baked start, phase by phase, from image-flow runs (bench/vllm_image_flow.py).

    python3 bench/vllm_startup_floor.py --run RUN.json --previous PREV.json --out OUT.json
        [--target MODEL=SECONDS ...]

``summary`` is keyed by model (``ready_cold_s``, ``ready_warm_s``, the target and whether
it was met); ``phases`` holds, per model, the table of the issue's phases for the cold
start, the baked start, each further baked start of the run (``--also-env``, a rebake) and
the previous baked start. Prints the table as Markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# The phases, each the sum of the flow's segments (vllm_image_flow.SEGMENTS).
PHASES: dict[str, tuple[str, ...]] = {
    "imports (kernelbake serve, vllm serve up to its banner)": (
        "kernelbake_start",
        "vllm_api_server_imports",
    ),
    "engine core start": ("engine_core_start",),
    "model load (device init, dummy weights)": ("engine_core_to_model_loaded",),
    "compile load (Dynamo, AOT artifact, Inductor graphs)": ("torch_compile",),
    "graphs and warm-up (KV cache, CUDA graphs, engine ready)": ("cuda_graphs", "engine_ready"),
    "ready (API server up, /health)": ("api_server_ready", "health"),
}


def phases(breakdown: list[dict[str, Any]] | None) -> dict[str, float | None]:
    seg = {b["segment"]: b["s"] for b in breakdown or [] if b.get("s") is not None}
    out: dict[str, float | None] = {}
    for name, parts in PHASES.items():
        found = [seg[p] for p in parts if p in seg]
        out[name] = round(sum(found), 2) if len(found) == len(parts) else None
    return out


def starts(model_doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every start of one model in a run: name → (ready_s, breakdown)."""
    out: dict[str, dict[str, Any]] = {}
    for key, label in (("serve_cold", "cold"), ("serve_warm", "baked")):
        if model_doc.get(key, {}).get("ready_s") is not None:
            out[label] = model_doc[key]
    for also in model_doc.get("serve_warm_also", []):
        out[f"baked, {also['env']}"] = also
    for re in model_doc.get("rebaked", []):
        out[f"rebaked with {re['env']}"] = re
    return out


def build(run: dict[str, Any], previous: dict[str, Any] | None, targets: dict[str, float]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    table: dict[str, Any] = {}
    for model, doc in run["models"].items():
        found = starts(doc)
        cols = {
            name: {**phases(s.get("breakdown_s")), "launch → /health": s.get("ready_s")}
            for name, s in found.items()
        }
        prev = ((previous or {}).get("models") or {}).get(model, {}).get("serve_warm")
        if prev:
            cols["previous baked"] = {
                **phases(prev.get("breakdown_s")),
                "launch → /health": prev.get("ready_s"),
            }
        table[model] = cols
        warm = found.get("baked", {}).get("ready_s")
        s = run.get("summary", {}).get(model, {})
        summary[model] = {
            "ready_cold_s": found.get("cold", {}).get("ready_s"),
            "ready_warm_s": warm,
            "ready_warm_previous_s": (prev or {}).get("ready_s"),
            "target_warm_s": targets.get(model),
            "met": warm <= targets[model] if warm is not None and model in targets else None,
            "tokens_identical": s.get("tokens_identical"),
            "files_added_after_ready": s.get("files_added_after_ready"),
            "compile_lines_after_ready": s.get("compile_lines_after_ready"),
            "other_baked_starts": {
                name: st.get("ready_s") for name, st in found.items() if name not in ("cold", "baked")
            },
        }
    return {"bench": "vllm_startup_floor", "summary": summary, "phases": table}


def markdown(doc: dict[str, Any]) -> str:
    lines = []
    for model, cols in doc["phases"].items():
        names = list(cols)
        lines += [f"### {model}", "", "| phase (s) | " + " | ".join(names) + " |"]
        lines.append("|---|" + "---:|" * len(names))
        rows = list(next(iter(cols.values())))
        for row in rows:
            cells = [cols[n].get(row) for n in names]
            text = ["" if c is None else f"{c:.2f}" for c in cells]
            if row == "launch → /health":
                text = [f"**{t}**" if t else t for t in text]
            lines.append(f"| {row} | " + " | ".join(text) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--previous", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--target", action="append", default=[], metavar="MODEL=SECONDS")
    a = ap.parse_args()
    run = json.loads(a.run.read_text())
    previous = json.loads(a.previous.read_text()) if a.previous else None
    targets = {m: float(v) for m, v in (t.split("=", 1) for t in a.target)}
    doc = build(run, previous, targets)
    doc["inputs"] = {"run": str(a.run), "previous": str(a.previous) if a.previous else None}
    a.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
