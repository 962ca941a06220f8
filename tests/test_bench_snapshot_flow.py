"""The snapshot phases of the image flow (bench/snapshot_flow.py) on CPU: every bad input it
makes is refused by serve's real gate before any restore, with the reason it expects (and the
snapshot it started from is not: the judge can fail); serve's restore line is read back into
phases; the summary and the phase table carry the issue's figures."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from kernelbake.contract.snapshot import SnapshotFile, Weights
from kernelbake.runtime.snapshot import hashing
from kernelbake.runtime.snapshot import restore as restore_mod
from kernelbake.runtime.snapshot.restore import start_from_snapshot
from tests.runtime.snapshot.fakes import FakeCriu, FakeDriver
from tests.runtime.snapshot.test_gate import TREE_PID, _env, _free_port, _snapshot
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


@pytest.mark.parametrize(("weights", "last"), [("outside", "weights reloaded"), ("beside", "weights copied")])
def test_the_restore_line_reads_back_into_phases(
    snap: tuple[Path, int], monkeypatch: pytest.MonkeyPatch, weights: str, last: str
) -> None:
    flow = _flow()
    tmp_path, port = snap
    criu = FakeCriu(port)
    more = {"images/weights/part-0000.bin": b"p" * 10} if weights == "beside" else None
    digest = _snapshot(tmp_path, port, driver=FakeDriver(), criu=criu, weights=Weights(weights), more=more)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"w" * 1000)

    def read_ahead(model: Path, images: Sequence[Path] = ()) -> restore_mod.readahead.ReadAhead:
        ahead = restore_mod.readahead.ReadAhead([*images, weights], 10_000, images=len(images))
        ahead.thread.start()
        ahead.thread.join()
        return ahead

    monkeypatch.setattr(restore_mod.readahead, "start", read_ahead)
    lines = _serve(tmp_path, {}, digest, criu)
    found = flow.said(lines, flow.RESTORED)
    assert found is not None
    parsed = flow.parse_restored(found[1])
    assert list(parsed["phases_s"]) == [
        "criu restore",
        "driver restore",
        "/is_sleeping",  # taken asleep: /health is 503 until the weights are back
        "woken",
        last,
    ]
    assert parsed["serving_after_restore_start_s"] >= parsed["phases_s"]["criu restore"]
    files = 2 + len(more or {})
    assert (
        parsed["files_checked"] == f"{files} files checked by sizes and sha256 ({hashing.workers()} at once)"
    )
    # Serve read the snapshot's images first (the stand-in's few bytes), then the weights.
    assert parsed["read_ahead_done"] is True and parsed["read_ahead_bytes"] > 1000


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
    beside = flow.snapshot_args(args, 8000, weights_files=True, beside=True)
    assert beside[-4:] == [
        "--worker-extension-cls",
        "kernelbake.runtime.engines.vllm.snapshot_weights.SnapshotWeights",
        "--port",
        "8000",
    ]


def test_a_failed_take_is_the_summary_s_failure_in_take_s_own_words() -> None:
    flow = _flow()
    assert flow.take_failed({"rc": 0, "wall_s": 61.0}) is None
    error = "+ criu check --all\nkernelbake snapshot: error: the driver's cuCheckpointProcessLock failed with CUresult 3\n"
    assert flow.take_failed({"rc": 3, "error": error}) == (
        "take exited 3: kernelbake snapshot: error: the driver's cuCheckpointProcessLock failed with CUresult 3"
    )
    assert flow.take_failed({"rc": -9}) == "take exited -9: no output"


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
                "restored-warm": {"ready_s": 8.0},
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
    assert s["ready_restored_warm_cache_s"] == 8.0
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


# The weight files (--weights-from) and the tokens the restores are compared with.

TINY_MOE_FP8 = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 384,
    "moe_intermediate_size": 128,
    "num_experts": 4,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 512,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
}
TINY_QWEN3 = {k: v for k, v in TINY_MOE_FP8.items() if k not in ("num_experts", "moe_intermediate_size")} | {
    "architectures": ["Qwen3ForCausalLM"],
    "quantization_config": None,
}


def _model_dir(tmp_path: Path, config: dict[str, object]) -> Path:
    import json

    model = tmp_path / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_generated_weights_are_a_checkpoint_the_snapshot_starts_load(tmp_path: Path) -> None:
    flow = _flow()
    model = _model_dir(tmp_path, TINY_MOE_FP8)
    made = flow.make_weights("generated", 0, model)
    assert made["ok"] and made["made"] == "generated" and made["seed"] == flow.SEED
    assert [p.name for p in flow.weight_files(model)] == ["model-00001-of-00001.safetensors"]
    assert made["bytes"] == (model / "model-00001-of-00001.safetensors").stat().st_size
    assert (model / "model.safetensors.index.json").is_file()
    # A config it does not know: no files, the reason said (the snapshot then keeps the weights in).
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"architectures": ["MixtralForCausalLM"]}')
    refused = flow.make_weights("generated", 0, other)
    assert not refused["ok"] and "architectures" in refused["error"] and flow.weight_files(other) == []


def test_auto_saves_what_the_converter_splits_and_generates_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = _flow()
    saves: list[Path] = []

    def save(port: int, model: Path) -> dict[str, object]:
        saves.append(model)
        return {"ok": True, "made": "saved"}

    monkeypatch.setattr(flow, "save_weights", save)
    moe = _model_dir(tmp_path, TINY_MOE_FP8)
    made = flow.make_weights("auto", 0, moe)
    # The MoE's config says the converter would refuse: generated without saving ~30 GB first.
    assert made["made"] == "generated" and made["ok"] and "mixture of experts" in made["not_saved"]
    assert saves == []
    dense = _model_dir(tmp_path / "d", TINY_QWEN3)
    assert flow.make_weights("auto", 0, dense) == {"ok": True, "made": "saved"} and saves == [dense]
    assert flow.make_weights("saved", 0, moe) == {"ok": True, "made": "saved"}
    # A refusal after saving (a layout the config did not tell): auto generates, saved does not.
    monkeypatch.setattr(flow, "save_weights", lambda p, m: {"ok": False, "made": "saved", "refused": True})
    after = flow.make_weights("auto", 0, dense)
    assert after["made"] == "generated" and after["ok"] and after["saved_first"]["refused"]
    assert flow.make_weights("saved", 0, dense)["ok"] is False
    with pytest.raises(ValueError, match="--weights-from"):
        flow.make_weights("dummy", 0, dense)


def test_a_converter_refusal_after_saving_is_marked_and_the_sharded_files_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import contextlib
    import io

    flow = _flow()
    model = _model_dir(tmp_path, TINY_MOE_FP8)
    import json
    import struct

    # What save_sharded_state writes for the MoE: fused experts, which the converter refuses.
    header = json.dumps(
        {"model.layers.0.mlp.experts.w13_weight": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}
    )
    (model / "model-rank-0-part-0.safetensors").write_bytes(
        struct.pack("<Q", len(header)) + header.encode() + b"\0\0"
    )
    monkeypatch.setattr(
        flow.urllib.request, "urlopen", lambda *a, **k: contextlib.nullcontext(io.BytesIO(b"{}"))
    )
    got = flow.save_weights(0, model)
    assert got["refused"] and not got["ok"] and got["made"] == "saved" and "experts" in got["error"]
    assert list(model.glob("model-rank-*")) == []


class _FallbackServer:
    """A serve whose snapshot is refused and whose baked fallback becomes ready."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int, logs: Path) -> None:
        self.lines = [(0.4, "kernelbake serve: snapshot not used: cache key …; starting the baked way")]
        self.proc = type("P", (), {"poll": lambda self: None})()
        self.ready_s: float | None = None
        self.generated: list[str] = []

    def generate(self, model: str) -> dict[str, object]:
        self.generated.append(model)
        return {"tokens": [7, 8, 9]}

    def stop(self) -> dict[str, object]:
        return {}


def _setup(tmp_path: Path, left: float) -> object:
    import types

    flow = _flow()

    def wait_ready(server: _FallbackServer, started: float, timeout: float) -> None:
        server.ready_s = 21.5

    run = types.SimpleNamespace(
        argv=["kernelbake", "serve", "--x"],
        logs=tmp_path,
        model_path="/models/m",
        left=lambda: left,
        put_back=0,
    )

    def as_the_image(of: object) -> list[str]:
        # The cache root is put back as the image holds it before any server starts.
        assert of is run
        run.put_back += 1
        return []

    fake = types.SimpleNamespace(Server=_FallbackServer, wait_ready=wait_ready, as_the_image=as_the_image)
    return flow.Setup(fake, run, tmp_path / "s", tmp_path / "r", tmp_path, ["--x", "--port", "1"], {}, 1)


def test_the_mismatch_fallback_gives_the_reference_tokens_of_generated_weights(tmp_path: Path) -> None:
    flow = _flow()
    # 100 s left: enough to wait for the fallback when its tokens are the reference...
    setup = _setup(tmp_path, 100.0)
    got = flow.mismatch(setup, reference=True)
    assert got["tokens"] == [7, 8, 9] and got["ready_s"] == 21.5 and got["said_after_s"] == 0.4
    assert setup.run.put_back == 1  # type: ignore[attr-defined]
    # ...not otherwise (the 150 s it always needed).
    got = flow.mismatch(_setup(tmp_path, 100.0), reference=False)
    assert got["tokens"] is None and got["ready_s"] is None


def test_generated_weights_compare_the_restore_with_a_start_from_the_checkpoint() -> None:
    flow = _flow()
    doc: dict[str, object] = {
        "warm_generate": {"tokens": [1, 2, 3]},
        "snapshot_weights": {"ok": True, "made": "generated", "s": 38.2, "bytes": 31_161_965_568},
        "snapshot": {
            "take": {"weights": "outside", "wall_s": 70.0},
            "restores": {"restored": {"ready_s": 12.0, "tokens": [7, 8, 9]}},
            "mismatch": {"said_after_s": 0.5, "tokens": [7, 8, 9]},
        },
    }
    s = flow.summary(doc, "qwen3-30b-a3b-fp8-sleep")
    assert s["tokens_reference"] == flow.REF_CHECKPOINT and s["tokens_identical_restored"] is True
    assert (s["weights_made"], s["weights_made_s"], s["weights_bytes"]) == ("generated", 38.2, 31_161_965_568)
    assert s["target_restored_s"] == 15.0 and s["met"] is True
    # The baked start's dummy tokens are not the reference: they would differ and say nothing.
    doc["snapshot"]["mismatch"]["tokens"] = [1, 2, 3]  # type: ignore[index]
    assert flow.summary(doc, "qwen3-30b-a3b-fp8-sleep")["tokens_identical_restored"] is False
    # No fallback tokens (no time left for it): no comparison, rather than the wrong one.
    doc["snapshot"]["mismatch"]["tokens"] = None  # type: ignore[index]
    assert flow.summary(doc, "qwen3-30b-a3b-fp8-sleep")["tokens_identical_restored"] is None
    # Weights inside the snapshot (take's other path): the restored engine is the baked start's.
    doc["snapshot"]["take"]["weights"] = "inside"  # type: ignore[index]
    doc["snapshot"]["restores"]["restored"]["tokens"] = [1, 2, 3]  # type: ignore[index]
    s = flow.summary(doc, "qwen3-30b-a3b-fp8-sleep")
    assert s["tokens_reference"] == flow.REF_BAKED and s["tokens_identical_restored"] is True
    table = flow.phase_table({"qwen3-30b-a3b-fp8-sleep": doc})
    assert "| qwen3-30b-a3b-fp8-sleep | weights | files generated, 31161965568 B | 38.2 |" in table


def test_the_next_pid_is_moved_past_the_tree_s_and_never_back(snap: tuple[Path, int]) -> None:
    """A host's second restore failed on a pid a process started after the first held: before
    each restore the flow moves the kernel's counter past the tree's pids."""
    flow = _flow()
    tmp_path, port = snap
    _snapshot(tmp_path, port, driver=FakeDriver(), criu=FakeCriu(port))
    counter = tmp_path / "ns_last_pid"
    counter.write_text("500\n")
    top = flow.past_tree_pids(tmp_path / "snapshot", counter=counter)
    assert top == TREE_PID + 10_000 and counter.read_text() == f"{top}\n"
    counter.write_text(f"{top + 7}\n")
    assert flow.past_tree_pids(tmp_path / "snapshot", counter=counter) == top
    assert counter.read_text() == f"{top + 7}\n"
    assert flow.past_tree_pids(tmp_path / "snapshot", counter=tmp_path / "absent") is None


def test_a_read_ahead_still_going_at_serving_is_read_as_not_done() -> None:
    line = (
        "restored snapshot sha256:6dba79e55eff (4 processes, 3774966854 B, weights outside), serving 9.10 s after "
        "the start of the restore (criu restore 3.53 s; 169 files checked by sizes (x) in 0.01 s before it); "
        "8000000000 B read ahead beside it (the snapshot's 170 image files, then 4 weight files, still reading); "
        "the engine's output goes on in /x"
    )
    parsed = _flow().parse_restored(line)
    assert (parsed["read_ahead_bytes"], parsed["read_ahead_done"]) == (8_000_000_000, False)
    assert parsed["phases_s"] == {"criu restore": 3.53} and parsed["serving_after_restore_start_s"] == 9.1


def test_a_takes_bytes_are_told_by_kind_pages_dev_shm_weights_and_the_rest() -> None:
    files = [
        SnapshotFile(path="images/pages-1.img", size=300, sha256="a" * 64),
        SnapshotFile(path="images/pages-12.img", size=20, sha256="b" * 64),
        SnapshotFile(path="images/dev-shm/psm_1", size=7, sha256="c" * 64, mode=0o600),
        SnapshotFile(path="images/mm-1.img", size=5, sha256="d" * 64),
        SnapshotFile(path="images/engine.log", size=1, sha256="e" * 64),
        SnapshotFile(path="images/weights/part-0000.bin", size=1000, sha256="f" * 64),
        SnapshotFile(path="images/weights/index.json", size=2, sha256="0" * 64),
    ]
    assert _flow().bytes_by_kind(files) == {"pages": 320, "dev_shm": 7, "weights": 1002, "other": 6}


def test_room_sets_takes_estimate_beside_what_was_written_without_the_weights() -> None:
    by_kind = {"pages": 320, "dev_shm": 7, "weights": 1002, "other": 6}
    assert _flow().room({"room_need_bytes": 400.0, "dump_s": 1.0}, by_kind) == {
        "need_bytes": 400,
        "written_bytes": 333,
        "need_over_written": 1.2012,
    }
    # A snapshot taken before take kept its estimate says nothing rather than a ratio of zero.
    assert _flow().room({"dump_s": 1.0}, by_kind) is None


def test_the_restore_s_criu_log_is_kept_and_its_longest_waits_named(tmp_path: Path) -> None:
    flow = _flow()
    old, new = tmp_path / "kernelbake-restore-a", tmp_path / "kernelbake-restore-b"
    old.mkdir()
    new.mkdir()
    (old / "restore.log").write_text("(00.000001) an older restore\n(09.000000) not this one\n")
    log = (
        "(00.000100) Restoring task 1\n"
        "a line CRIU wrote without a stamp\n"
        "(00.200100) Opening /usr/lib/libtorch_cuda.so\n"
        "(03.700100) Restoring memory\n"
        "(03.800100) pie: 1: restoring pages\n"
        "(05.000100) Restore finished\n"
    )
    (new / "restore.log").write_text(log)
    os.utime(old / "restore.log", (1, 1))
    dest = tmp_path / "kept.log"
    assert flow.keep_restore_log(tmp_path, dest) == log
    assert dest.read_text() == log
    waits = flow.criu_waits(log)
    assert waits[:2] == [
        [3.5, "Opening /usr/lib/libtorch_cuda.so", "Restoring memory"],
        [1.2, "pie: 1: restoring pages", "Restore finished"],
    ]
    assert [w[0] for w in waits] == sorted((w[0] for w in waits), reverse=True) and len(waits) == 4
    assert flow.keep_restore_log(tmp_path / "none", dest) is None
