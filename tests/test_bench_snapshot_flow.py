"""The snapshot phases of the image flow (bench/snapshot_flow.py) on CPU: every bad input it
makes is refused by serve's real gate before any restore, with the reason it expects (and the
snapshot it started from is not: the judge can fail); serve's restore line is read back into
phases; the summary and the phase table carry the issue's figures."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from kernelbake.contract.snapshot import Weights
from kernelbake.runtime.snapshot import restore as restore_mod
from kernelbake.runtime.snapshot.restore import start_from_snapshot
from tests.runtime.snapshot.fakes import FakeCriu, FakeDriver
from tests.runtime.snapshot.test_gate import _env, _free_port, _snapshot
from tests.support import bench
from tests.support.runtime_target import write_target


def _flow() -> ModuleType:
    return bench.load("snapshot_flow")


@pytest.fixture
def snap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, int]:
    write_target(tmp_path, "tiny-llama.yaml")
    monkeypatch.setattr(restore_mod, "ENGINE_LOG", str(tmp_path / "engine-log/engine.log"))
    (tmp_path / "marks").mkdir()
    return tmp_path, _free_port()


def _serve(
    tmp_path: Path, env_changes: dict[str, str], digest: str, criu: FakeCriu
) -> list[tuple[float, str]]:
    said: list[str] = []
    env = _env(tmp_path, digest, **env_changes)
    if "KERNELBAKE_IMAGE_DIGEST" in env_changes or "KERNELBAKE_SNAPSHOT_DIGEST" in env_changes:
        extra = {k: v for k, v in env.environ.items() if k.startswith("KERNELBAKE_")} | env_changes
        from tests.support.runtime_target import runtime_env

        env = runtime_env(tmp_path, **extra)
    start_from_snapshot(env, [], driver=FakeDriver(), criu=criu, say=said.append)  # type: ignore[arg-type]
    return [(0.1, "kernelbake serve: " + line) for line in said]


def test_every_bad_input_is_refused_before_any_restore_and_the_good_one_is_not(
    snap: tuple[Path, int],
) -> None:
    flow = _flow()
    tmp_path, port = snap
    criu = FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=FakeDriver(), criu=criu)
    good = tmp_path / "snapshot-good"
    (tmp_path / "snapshot").rename(good)
    bads = flow.bad_inputs(good, tmp_path / "bad", digest)
    assert [b.name for b in bads] == [
        "tampered page file",
        "truncated image",
        "foreign key",
        "another image digest",
        "another GPU model",
        "another driver",
        "another snapshot.json than the pinned one",
    ]
    for b in bads:
        flow.point(tmp_path / "snapshot", b.root)
        lines = _serve(tmp_path, dict(b.env), digest, criu)
        verdict = flow.judged(b, lines, tmp_path / "marks")
        assert verdict["refused_before_restore"], (b.name, verdict)
        assert criu.restores == [], b.name
    # The snapshot they were made from is intact (hard links, the changed files copied) and restores.
    flow.point(tmp_path / "snapshot", good)
    lines = _serve(tmp_path, {}, digest, criu)
    verdict = flow.judged(bads[0], lines, tmp_path / "marks")
    assert not verdict["refused_before_restore"] and verdict["restored"]


def test_the_restore_line_reads_back_into_phases(snap: tuple[Path, int]) -> None:
    flow = _flow()
    tmp_path, port = snap
    criu = FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=FakeDriver(), criu=criu, weights=Weights.OUTSIDE)
    lines = _serve(tmp_path, {}, digest, criu)
    found = flow.said(lines, flow.RESTORED)
    assert found is not None
    parsed = flow.parse_restored(found[1])
    assert list(parsed["phases_s"]) == [
        "criu restore",
        "driver restore",
        "/is_sleeping",  # weights outside: /health is 503 until the weights are back
        "woken",
        "weights reloaded",
    ]
    assert parsed["serving_after_restore_start_s"] >= parsed["phases_s"]["criu restore"]
    assert parsed["files_checked"] == "2 files checked by sizes and sha256"


def test_the_snapshot_starts_load_the_written_weights_behind_the_guard() -> None:
    flow = _flow()
    args = ["--load-format", "dummy", "--seed", "0"]
    assert flow.snapshot_args(args, 8000, weights_files=True) == [
        "--load-format",
        "safetensors",
        "--seed",
        "0",
        "--middleware",
        "kernelbake.runtime.snapshot.devguard.loopback_only",
        "--port",
        "8000",
    ]
    assert flow.snapshot_args(args, 8000, weights_files=False)[:2] == ["--load-format", "dummy"]


def test_the_summary_and_the_phase_table_carry_the_issues_figures() -> None:
    flow = _flow()
    doc = {
        "serve_cold": {"ready_s": 162.6},
        "serve_warm": {"ready_s": 26.3},
        "warm_generate": {"tokens": [1, 2, 3]},
        "snapshot": {
            "take": {"wall_s": 61.0, "bytes": 4_430_000_000, "files": 120, "weights": "outside"},
            "restores": {
                "restored": {
                    "ready_s": 9.4,
                    "restore_start_s": 1.1,
                    "phases_s": {"criu restore": 3.3, "weights reloaded": 3.9},
                    "tokens": [1, 2, 3],
                    "files_added_after_ready_count": 0,
                    "compile_lines_after_ready": [],
                },
                "restored-overlap": {"ready_s": 8.0},
            },
            "mismatch": {
                "said_after_s": 0.62,
                "said": "snapshot not used: serve env … ; starting the baked way",
            },
            "bad_inputs": {"truncated image": {"refused_before_restore": True}},
        },
    }
    s = flow.summary(doc, "qwen3-8b-sleep")
    assert (s["ready_cold_s"], s["ready_baked_s"], s["ready_restored_s"], s["snapshot_bytes"]) == (
        162.6,
        26.3,
        9.4,
        4_430_000_000,
    )
    assert s["target_restored_s"] == 10.0 and s["met"] is True and s["tokens_identical_restored"] is True
    assert s["key_mismatch_fallback_s"] == 0.62 and s["bad_inputs_refused"] == {"truncated image": True}
    doc["snapshot"]["restores"]["restored"]["tokens"] = [9]
    assert flow.summary(doc, "qwen3-8b-sleep")["tokens_identical_restored"] is False
    table = flow.phase_table({"qwen3-8b-sleep": doc})
    assert "| qwen3-8b-sleep | restored | criu restore | 3.3 |" in table
    assert "| qwen3-8b-sleep | restored | **launch → serving** | **9.4** |" in table
    assert "| qwen3-8b-sleep | key mismatch | launch → `snapshot not used` | 0.62 |" in table


def test_the_criu_wrapper_skips_the_network_lock_only_to_dump_and_restore(tmp_path: Path) -> None:
    import subprocess

    flow = _flow()
    fake = tmp_path / "criu"
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    wrapper = flow.skip_lock(str(fake), tmp_path / "wrapped")

    def said(*args: str) -> str:
        return subprocess.run([wrapper, *args], capture_output=True, text=True, check=True).stdout.strip()

    assert said("dump", "-t", "7") == "dump -t 7 --network-lock skip"
    assert said("restore", "-d") == "restore -d --network-lock skip"
    assert said("--version") == "--version" and said("check", "--all") == "check --all"
