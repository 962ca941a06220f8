"""bench/vllm_startup_floor.py: the issue's phases are sums of the image flow's segments, and
a phase whose segment is missing is left empty rather than counted short."""

from __future__ import annotations

from typing import Any

from tests.support import bench


def _start(ready: float, **segments: float) -> dict[str, Any]:
    return {"ready_s": ready, "breakdown_s": [{"segment": k, "s": v} for k, v in segments.items()]}


SEGMENTS = {
    "kernelbake_start": 0.1,
    "vllm_api_server_imports": 11.0,
    "engine_core_start": 0.3,
    "engine_core_to_model_loaded": 3.0,
    "torch_compile": 5.0,
    "cuda_graphs": 5.0,
    "engine_ready": 1.0,
    "api_server_ready": 0.3,
    "health": 0.4,
}


def test_phases_sum_the_flow_segments_and_the_summary_is_keyed_by_model() -> None:
    floor = bench.load("vllm_startup_floor")
    run = {
        "models": {
            "m": {
                "serve_cold": _start(150.0, **SEGMENTS),
                "serve_warm": _start(26.1, **SEGMENTS),
                "rebaked": [{"env": "X=1", **_start(22.0, **SEGMENTS)}],
            }
        },
        "summary": {"m": {"tokens_identical": True, "files_added_after_ready": 0}},
    }
    previous = {"models": {"m": {"serve_warm": _start(31.0, **{**SEGMENTS, "torch_compile": 8.0})}}}
    doc = floor.build(run, previous, {"m": 25.0})
    cols = doc["phases"]["m"]
    assert list(cols) == ["cold", "baked", "rebaked with X=1", "previous baked"]
    baked = cols["baked"]
    assert baked["imports (kernelbake serve, vllm serve up to its banner)"] == 11.1
    assert baked["graphs and warm-up (KV cache, CUDA graphs, engine ready)"] == 6.0
    assert cols["previous baked"]["compile load (Dynamo, AOT artifact, Inductor graphs)"] == 8.0
    s = doc["summary"]["m"]
    assert (s["ready_cold_s"], s["ready_warm_s"], s["met"]) == (150.0, 26.1, False)
    assert s["other_baked_starts"] == {"rebaked with X=1": 22.0}
    assert "| launch → /health | **150.00** | **26.10** | **22.00** | **31.00** |" in floor.markdown(doc)


def test_a_missing_segment_leaves_its_phase_empty() -> None:
    floor = bench.load("vllm_startup_floor")
    partial = {k: v for k, v in SEGMENTS.items() if k != "engine_ready"}
    got = floor.phases(_start(1.0, **partial)["breakdown_s"])
    assert got["graphs and warm-up (KV cache, CUDA graphs, engine ready)"] is None
    assert got["engine core start"] == 0.3
