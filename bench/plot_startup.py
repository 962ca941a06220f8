"""The startup phases as a picture for docs/performance.md (issue 44 item 5), drawn from the
committed bench JSON, never by hand: ``make docs`` runs ``--write``; tests/test_docs_pictures.py
runs ``--check``, which fails when the committed SVG is not what the JSON draws.

    python3 bench/plot_startup.py --write   # docs/performance/startup-phases.svg
    python3 bench/plot_startup.py --check   # exit 1 when that file is stale

Each source is a result with ``phases: {model: {start: {phase: seconds}}}`` (bench/
vllm_startup_floor.py writes it). The starts drawn are ``cold``, ``baked`` and, once the
snapshot work writes them into the same shape, every start whose name begins with ``restored``;
the others (levers tried once) stay in the JSON and the page's table. A bar is the phases
stacked in the order the JSON lists them, labelled with launch → /health.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SOURCES = (REPO / "bench/results/vllm-0.26.0-h200-startup-floor-2026-12-03/startup-floor.json",)
OUT = REPO / "docs/performance/startup-phases.svg"
TOTAL = "launch → /health"
DRAWN = ("cold", "baked")
# A fixed palette, one colour per phase in order: the picture changes only with the data.
COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")


def starts(doc: dict[str, Any]) -> list[tuple[str, dict[str, float]]]:
    """(label, phases) of each start drawn, in the JSON's order, model by model."""
    out = []
    for model, by_start in doc["phases"].items():
        for start, phases in by_start.items():
            if start in DRAWN or start.startswith("restored"):
                out.append((f"{model}, {start}", phases))
    return out


def render(sources: tuple[Path, ...] = SOURCES) -> bytes:
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    # Byte-stable output for the same data: no date, fixed ids, text kept as text.
    matplotlib.rcParams.update({"svg.hashsalt": "kernelbake", "svg.fonttype": "none"})
    rows = [row for src in sources for row in starts(json.loads(src.read_text()))]
    names = [p for _, phases in rows for p in phases if p != TOTAL]
    order = list(dict.fromkeys(names))
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(rows) + 1.8))
    for y, (_, phases) in enumerate(rows):
        left = 0.0
        for i, phase in enumerate(order):
            width = phases.get(phase, 0.0)
            ax.barh(y, width, left=left, color=COLOURS[i % len(COLOURS)], label=phase if y == 0 else None)
            left += width
        ax.text(left + 1, y, f"{phases.get(TOTAL, left):.1f} s", va="center")
    longest = max(phases.get(TOTAL, 0.0) for _, phases in rows)
    ax.set_xlim(0, longest * 1.12)  # room for the last bar's label
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds from launch to /health")
    ax.set_title("Startup phases, one H200, vLLM 0.26 (bench/results)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=1, frameon=False, fontsize=8)
    buf = io.StringIO()
    # No matplotlib version in the file: a patch release that draws the same bytes reads as current.
    meta = {"Date": None, "Creator": "bench/plot_startup.py"}
    fig.savefig(buf, format="svg", metadata=meta, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue().encode()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(REPO)}")
    mode.add_argument("--check", action="store_true", help="exit 1 when the committed picture is stale")
    a = p.parse_args(argv)
    drawn = render()
    if a.write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_bytes(drawn)
        print(json.dumps({"wrote": str(OUT.relative_to(REPO)), "bytes": len(drawn)}))
        return 0
    current = OUT.is_file() and OUT.read_bytes() == drawn
    print(json.dumps({"picture": str(OUT.relative_to(REPO)), "current": current}))
    if not current:
        print(f"{OUT.relative_to(REPO)} is stale: run `make docs`", file=sys.stderr)
    return 0 if current else 1


if __name__ == "__main__":
    sys.exit(main())
