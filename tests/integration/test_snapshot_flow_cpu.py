"""The GPU harness of issue 40 (bench/vllm_image_flow.py --snapshot) played end to end on the
vLLM CPU base image before any device session spends time on it: bake, baked start, take, a
restore through serve's gate, the key mismatch and the seven bad inputs. Two device runs were
lost to the harness itself (a stale context; a pin taken from the manifest written again rather
than the file, so every restore fell back to the baked start, 2026-12-07); both show here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support import bench, criu
from tests.support.docker import VLLM_CPU_BASE, docker, require_cpu_base

pytestmark = [pytest.mark.docker, pytest.mark.slow]

PLAY = (
    "python3 bench/vllm_image_flow.py --context /ctx/tiny-llama-cpu/context --skip-checks "
    "--mix-total 0 --baked-only tiny-llama --serve-args-for 'tiny-llama=--seed 0' "
    "--snapshot tiny-llama --criu /opt/kernelbake-criu/bin/criu --deadline 1500 --out /out"
)


def test_the_snapshot_harness_restores_through_serve_and_refuses_every_bad_input(tmp_path: Path) -> None:
    require_cpu_base(VLLM_CPU_BASE)
    prefix = criu.install(tmp_path / "criu")
    ctx, out = tmp_path / "ctx", tmp_path / "out"
    out.mkdir()
    bench.render_default_cpu(ctx)
    # --init: take and restore share this container, and a shell as pid 1 would leave the
    # dumped tree's processes unreaped, holding the pids the restore needs.
    name = f"kb-snapflow-{tmp_path.name}"
    try:
        done = docker(
            "run", "--name", name, "--init", "--privileged", "--shm-size", "2g", "--network", "none",
            "-v", f"{REPO}:/kb:ro", "-v", f"{ctx}:/ctx:ro", "-v", f"{out}:/out",
            "-v", f"{prefix}:/opt/kernelbake-criu:ro", "-w", "/kb", VLLM_CPU_BASE, "bash", "-c", PLAY,
            check=False, timeout=1800,
        )  # fmt: skip
    finally:
        docker("rm", "-f", name, check=False)
    flow = out / "vllm-image-flow.json"
    assert flow.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(flow.read_text())
    s = doc["summary"]["tiny-llama"]
    snap = doc["models"]["tiny-llama"]["snapshot"]
    said = " ".join(snap["take"]["said"])
    # The pin is the file take wrote, as take itself names it.
    assert f"snapshot.json {snap['take']['digest']}" in said, (snap["take"]["digest"], said)
    assert isinstance(s["ready_restored_s"], float), snap["restores"]
    # What a cold restore reads, profiled after take (bench/snapshot_pages.py): the page files
    # are the bytes take counted as pages.
    pages = snap["take"]["pages"]
    assert pages["files"] > 0 and pages["bytes"] == snap["take"]["bytes_by_kind"]["pages"], pages
    assert (
        pages["zlib1_ratio"] > 1
        and snap["take"]["dev_shm"]["bytes"] == snap["take"]["bytes_by_kind"]["dev_shm"]
    )
    assert s["tokens_identical_restored"] is True
    # The restore's CRIU time, split by the work each wait follows: the engine's file mappings
    # opened and its pages read, and the kinds together the log's whole span.
    work = snap["restores"]["restored"]["criu_time_by_work"]
    assert work["opening file mappings"]["lines"] > 0 and work["reading pages"]["lines"] > 0, work
    span = max(row["last_s"] for row in work.values()) - min(row["first_s"] for row in work.values())
    assert abs(sum(row["waited_s"] for row in work.values()) - span) < 0.01, work
    assert s["key_mismatch_said"].startswith("snapshot not used: serve env"), s["key_mismatch_said"]
    assert len(s["bad_inputs_refused"]) == 7 and all(s["bad_inputs_refused"].values()), snap["bad_inputs"]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
