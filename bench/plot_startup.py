"""The startup phases as a picture for docs/performance.md (issue 44 item 5), drawn from the
committed bench JSON, never by hand: ``make docs`` runs ``--write``; tests/test_docs_pictures.py
runs ``--check``, which fails when the committed SVG is not what the JSON draws.

    python3 bench/plot_startup.py --write   # docs/performance/startup-phases.svg
    python3 bench/plot_startup.py --check   # exit 1 when that file is stale

One panel per machine, each bar labelled with what was measured and where:
- the H100, vLLM 0.32: bench/vllm_image_flow.py --snapshot's baked start (its segments, in the
  startup-floor's phases) and the restores through ``kernelbake serve`` (gate, CRIU, driver,
  wake-up, the weights' reload), launch → serving, with the page cache dropped and warm;
- the H200: the cold and baked starts of bench/vllm_startup_floor.py (``phases: {model: {start:
  {phase: seconds}}}``; every start named ``restored…`` in that shape is drawn too), and the CRIU
  restores of bench/vllm_snapshot_restore.py (the restore, the driver's restore, then ``/health``,
  counted from the restore's start; the server ran outside the image);
- the shared 2-core host: bench/snapshot_cpu.py's baked and restored starts of the CPU default
  image, ``docker run`` → ``/health`` as one span (the bench does not split it).
A bar is its phases stacked in the order the JSON gives them, labelled with its total.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench/results"
FLOOR = RESULTS / "vllm-0.26.0-h200-startup-floor-2026-12-03/startup-floor.json"
SNAPSHOT_H200 = RESULTS / "vllm-0.26.0-h200-snapshot-2026-12-04"
SNAPSHOT_CPU = RESULTS / "snapshot_cpu.json"
FLOW_8B_H100 = RESULTS / "vllm-0.32.0-h100-snapshot-2026-12-06-seventh/vllm-image-flow.json"
FLOW_MOE_H100 = RESULTS / "vllm-0.32.0-h100-moe-snapshot-2026-12-06/vllm-image-flow.json"
FLOW_MOE_BESIDE_H100 = RESULTS / "vllm-0.32.0-h100-moe-snapshot-2026-12-08/vllm-image-flow.json"
OUT = REPO / "docs/performance/startup-phases.svg"
TOTAL = "launch → /health"
DRAWN = ("cold", "baked")
# The phases of a CRIU restore (bench/vllm_snapshot_restore.py), in the order they run.
CRIU_RESTORE = "criu restore -d (the process tree's memory)"
DRIVER_RESTORE = "driver restore + unlock (GPU memory)"
RESTORED_HEALTH = "restored → /health"
UNSPLIT = "docker run → /health (not split)"
# The image flow's segments of a start (bench/vllm_image_flow.py ``breakdown_*_s``), drawn as the
# startup floor's phases so that one phase has one colour in every panel.
SEGMENTS = {
    "kernelbake_start": "imports (kernelbake serve, vllm serve up to its banner)",
    "vllm_api_server_imports": "imports (kernelbake serve, vllm serve up to its banner)",
    "engine_core_start": "engine core start",
    "engine_core_to_model_loaded": "model load (device init, dummy weights)",
    "torch_compile": "compile load (Dynamo, AOT artifact, Inductor graphs)",
    "cuda_graphs": "graphs and warm-up (KV cache, CUDA graphs, engine ready)",
    "engine_ready": "graphs and warm-up (KV cache, CUDA graphs, engine ready)",
    "api_server_ready": "ready (API server up, /health)",
    "health": "ready (API server up, /health)",
}
# serve's own restore line (bench/snapshot_flow.py ``phases_s``), in the order they run.
RESTORE_START = "launch → restore start (python, gate, files)"
RESTORE_PHASES = {
    "criu restore": CRIU_RESTORE,
    "driver restore": DRIVER_RESTORE,
    "/is_sleeping": "wake-up (/is_sleeping, woken)",
    "woken": "wake-up (/is_sleeping, woken)",
    "weights reloaded": "weights reloaded (vLLM's reload_weights)",
    "weights copied": "weights copied back (the snapshot's own files)",
}
# A fixed palette, one colour per phase in order: the picture changes only with the data.
COLOURS = (
    "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3",
    "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd",
    "#1b1b5e", "#b2df8a", "#f0e442", "#6b0f1a", "#00a087",
)  # fmt: skip

Row = tuple[str, dict[str, float]]  # label, phases (TOTAL among them)


@dataclass(frozen=True, kw_only=True)
class Panel:
    title: str
    sources: tuple[tuple[Path, Callable[[dict[str, Any]], list[Row]]], ...]

    def rows(self) -> list[Row]:
        return [row for path, read in self.sources for row in read(json.loads(path.read_text()))]


def starts(doc: dict[str, Any]) -> list[Row]:
    """(label, phases) of each start drawn from a startup-floor result, in the JSON's order."""
    out = []
    for model, by_start in doc["phases"].items():
        for start, phases in by_start.items():
            if start in DRAWN or start.startswith("restored"):
                out.append((start if len(doc["phases"]) == 1 else f"{model}, {start}", phases))
    return out


def criu_restores(what: str) -> Callable[[dict[str, Any]], list[Row]]:
    """The restore of each model in a bench/vllm_snapshot_restore.py result, its phases from
    the restore's start; ``what`` says which snapshot it was."""

    def read(doc: dict[str, Any]) -> list[Row]:
        out = []
        for model, runs in doc["models"].items():
            snap = runs["snapshot"]
            restore, driver, health = (
                snap["restore"]["s"],
                snap["driver_restore_s"],
                snap["restored_health_s"],
            )
            phases = {
                CRIU_RESTORE: restore,
                DRIVER_RESTORE: driver,
                RESTORED_HEALTH: max(health - restore - driver, 0.0),
                TOTAL: health,
            }
            out.append(
                (f"restored, {what}" if len(doc["models"]) == 1 else f"{model}, restored, {what}", phases)
            )
        return out

    return read


def _grouped(timed: Iterable[tuple[str, float]], names: Mapping[str, str]) -> dict[str, float]:
    """Seconds by drawn phase: each ``(key, s)`` added to the phase ``names`` maps its key to."""
    out: dict[str, float] = {}
    for key, s in timed:
        out[names[key]] = round(out.get(names[key], 0.0) + s, 2)
    return out


def flow_restores(name: str, *, dropped_mark: str = "") -> Callable[[dict[str, Any]], list[Row]]:
    """An image flow's baked start and its restores through serve (page cache dropped, then
    warm) for its one model, called ``name`` on the bars; ``dropped_mark`` after the dropped
    restore's label points at the title's note on it."""

    def read(doc: dict[str, Any]) -> list[Row]:
        (got,) = doc["models"].values()
        segments = ((seg["segment"], seg["s"]) for seg in got["summary"]["breakdown_warm_s"])
        baked = {**_grouped(segments, SEGMENTS), TOTAL: got["summary"]["ready_warm_s"]}
        out: list[Row] = [(f"{name}, baked", baked)]
        for run in got["snapshot"]["restores"].values():
            phases = {
                RESTORE_START: run["restore_start_s"],
                **_grouped(run["phases_s"].items(), RESTORE_PHASES),
                TOTAL: run["ready_s"],
            }
            cache = f"dropped{dropped_mark}" if run["page_cache_dropped"] else "warm"
            out.append((f"{name}, restored, page cache {cache}", phases))
        return out

    return read


def cpu_snapshot(doc: dict[str, Any]) -> list[Row]:
    """bench/snapshot_cpu.py's baked and restored starts, each one span."""
    return [
        (start, {UNSPLIT: doc[start]["ready_s"], TOTAL: doc[start]["ready_s"]})
        for start in ("baked", "restored")
    ]


PANELS = (
    Panel(
        title="Qwen3-8B and Qwen3-30B-A3B FP8 architectures, fake weights, on one H100, vLLM 0.32, through\n"
        "kernelbake serve, launch → serving (bench/vllm_image_flow.py --snapshot, 2026-12-06, the weights reloaded;\n"
        "2026-12-08, the MoE's weights beside, on a host with a faster disk and CPU; cold, not drawn: 8B 156.4 s,\n"
        "MoE 475.3 s and, 2026-12-08, 250.1 s). *That restore ran before serve read the snapshot first",
        sources=(
            (FLOW_8B_H100, flow_restores("Qwen3-8B")),
            (FLOW_MOE_H100, flow_restores("MoE", dropped_mark="*")),
            (FLOW_MOE_BESIDE_H100, flow_restores("MoE, weights beside")),
        ),
    ),
    Panel(
        title="Qwen3-8B architecture, dummy weights, on one H200, vLLM 0.26.\n"
        "Cold, baked: the image flow, launch → /health (2026-12-03). Restored: CRIU 4.2.1, from the\n"
        "restore's start, a server outside the image (2026-12-04); *the weights reload after /health, not measured",
        sources=(
            (FLOOR, starts),
            (SNAPSHOT_H200 / "weights-in.json", criu_restores("weights in")),
            (SNAPSHOT_H200 / "weights-out-sleep2.json", criu_restores("weights out*")),
        ),
    ),
    Panel(
        title="The CPU default image (tiny-llama, vLLM 0.32's CPU build) on the shared 2-core host,\n"
        "under other work's load: docker run → /health (bench/snapshot_cpu.py)",
        sources=((SNAPSHOT_CPU, cpu_snapshot),),
    ),
)


def _draw(ax: Any, rows: list[Row], order: list[str], seen: set[str]) -> None:
    """The panel's bars; each phase is labelled (for the one legend) where it is first drawn."""
    for y, (_, phases) in enumerate(rows):
        left = 0.0
        for phase in (p for p in order if p in phases):
            width = phases[phase]
            colour = COLOURS[order.index(phase) % len(COLOURS)]
            ax.barh(y, width, left=left, color=colour, label=None if phase in seen else phase)
            seen.add(phase)
            left += width
        ax.text(left, y, f" {phases.get(TOTAL, left):.1f} s", va="center")
    longest = max(phases.get(TOTAL, 0.0) for _, phases in rows)
    ax.set_xlim(0, longest * 1.15)  # room for the last bar's label
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds to /health")


def render(panels: tuple[Panel, ...] = PANELS) -> bytes:
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    # Byte-stable output for the same data: no date, fixed ids, text kept as text.
    matplotlib.rcParams.update({"svg.hashsalt": "kernelbake", "svg.fonttype": "none"})
    drawn = [panel.rows() for panel in panels]
    # One colour per phase across the panels, in the order the phases first appear.
    order = list(dict.fromkeys(p for rows in drawn for _, phases in rows for p in phases if p != TOTAL))
    heights = [0.5 * len(rows) + 0.4 for rows in drawn]
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(9, sum(heights) + 2.5), gridspec_kw={"height_ratios": heights}, squeeze=False
    )
    seen: set[str] = set()
    for ax, panel, rows in zip(axes[:, 0], panels, drawn, strict=True):
        _draw(ax, rows, order, seen)
        ax.set_title(panel.title, fontsize=9, loc="left")
    fig.subplots_adjust(hspace=0.75)
    # One legend for every panel, below the last (a phase has one colour throughout).
    handles = [h for ax in axes[:, 0] for h in ax.get_legend_handles_labels()[0]]
    fig.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(0.08, 0.02), ncol=2, frameon=False, fontsize=8
    )
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
