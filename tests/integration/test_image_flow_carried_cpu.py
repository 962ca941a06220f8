"""A device session is 30 minutes and the FP8 MoE's compile takes 8 to 11 of them: the GPU
harness saves a run's caches stage (``--save-caches``) and a later run, on another machine of the
same GPU model, bakes from it (``--caches-from``) instead of compiling. Played here on the vLLM
CPU base image before a device session depends on it: the second run compiles nothing, its baked
start compiles nothing either, and its document names the tar it baked from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support import bench
from tests.support.docker import VLLM_CPU_BASE, docker, require_cpu_base

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FLOW = (
    "python3 bench/vllm_image_flow.py --context /ctx/tiny-llama-cpu/context --skip-checks "
    "--mix-total 0 --baked-only tiny-llama --serve-args-for 'tiny-llama=--seed 0' --deadline 900"
)
# Two containers, as two machines: the second starts from the base image with only the tar.
PLAYS = (
    f"{FLOW} --save-caches tiny-llama --out /out/saved",
    f"{FLOW} --caches-from tiny-llama=/out/saved/tiny-llama/caches.tar.xz --out /out/carried",
)


def test_a_run_bakes_from_the_caches_stage_an_earlier_run_saved(tmp_path: Path) -> None:
    require_cpu_base(VLLM_CPU_BASE)
    ctx, out = tmp_path / "ctx", tmp_path / "out"
    out.mkdir()
    bench.render_default_cpu(ctx)
    for i, play in enumerate(PLAYS):
        name = f"kb-carried-{i}-{tmp_path.name}"
        try:
            done = docker(
                "run", "--name", name, "--init", "--shm-size", "2g", "--network", "none",
                "-v", f"{REPO}:/kb:ro", "-v", f"{ctx}:/ctx:ro", "-v", f"{out}:/out",
                "-w", "/kb", VLLM_CPU_BASE, "bash", "-c", play,
                check=False, timeout=900,
            )  # fmt: skip
        finally:
            docker("rm", "-f", name, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    saved = json.loads((out / "saved/vllm-image-flow.json").read_text())["models"]["tiny-llama"]
    carried = json.loads((out / "carried/vllm-image-flow.json").read_text())["models"]["tiny-llama"]
    assert "failed" not in saved and "failed" not in carried, carried.get("failed")
    # The tar the first run wrote is the one the second baked from, compiled on this "GPU".
    assert carried["compile_carried"]["sha256"] == saved["caches_saved"]["sha256"]
    assert carried["compile_carried"]["compiled_on"]["device"] == saved["compile_report"]["builder"]["device"]
    assert carried["bundle"] == saved["bundle"]
    summary = json.loads((out / "carried/vllm-image-flow.json").read_text())["summary"]["tiny-llama"]
    assert summary["compile_carried"] == carried["compile_carried"] and summary["compile_wall_s"] is None
    # Nothing compiled in the second run: no compile stage, and a baked start that compiled nothing.
    assert {step["stage"] for step in carried["steps"]} == {"runtime", "final"}
    assert "compile" in {step["stage"] for step in saved["steps"]}
    assert "compile_wall_s" not in carried and saved["compile_wall_s"] > 0
    assert isinstance(carried["serve_warm"]["ready_s"], float), carried["serve_warm"]
    warm_log = (out / "carried/tiny-llama/logs/serve-warm.log").read_text()
    assert "start-up compiled nothing" in warm_log, warm_log[-3000:]
