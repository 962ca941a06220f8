"""bench/reload_probe.py without a GPU: the order of its runs, and how each is measured and
judged, against a stand-in engine."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import bench

probe = bench.load("reload_probe")


def test_kernel_format_runs_last_since_its_reload_repoints_the_model() -> None:
    assert probe.plan(["kernel-format", "state-copy", "checkpoint", "checkpoint-threads"], drop=True) == [
        ("checkpoint", "warm"),
        ("checkpoint", "dropped"),
        ("checkpoint-threads", "warm"),
        ("checkpoint-threads", "dropped"),
        ("state-copy", "warm"),
        ("state-copy", "dropped"),
        ("kernel-format", "warm"),
        ("kernel-format", "dropped"),
    ]
    assert probe.plan(["checkpoint"], drop=False) == [("checkpoint", "warm")]


class Engine:
    def __init__(self, broken: str = "") -> None:
        self.calls: list[str] = []
        self.broken = broken
        self.tokens = [1, 2, 3]

    def generate(self) -> list[int]:
        return list(self.tokens)

    def sleep(self) -> None:
        self.calls.append("sleep")

    def wake(self) -> None:
        self.calls.append("wake")

    def reload(self, method: str) -> dict[str, int] | None:
        self.calls.append(f"reload {method}")
        if method == self.broken:
            raise AttributeError("`ModelRunner` has no parameter `lm_head.bias`")
        if method == "checkpoint-threads":
            # A reload that loads other values: the tokens differ.
            self.tokens = [9]
        if method == "state-copy":
            # The copy puts the first values back, and says what it covered.
            self.tokens = [1, 2, 3]
            return {"copied": 7, "not_in_files": 1}
        return None

    def save_kernel_format(self) -> int:
        self.calls.append("save")
        return 1234

    def read_only(self, method: str) -> int:
        self.calls.append(f"read {method}")
        if method == self.broken:
            raise OSError("No such file")
        return 5678


def test_the_checkpoint_ways_are_read_alone_warm_and_a_failure_is_recorded() -> None:
    engine = Engine(broken="checkpoint-threads")
    warmed: list[str] = []
    got = probe.reads(engine, list(probe.METHODS), warm=warmed.append)
    assert warmed == ["checkpoint", "checkpoint-threads"] and engine.calls == [
        "read checkpoint",
        "read checkpoint-threads",
    ]
    assert got[0]["method"] == "checkpoint" and got[0]["bytes"] == 5678 and got[0]["read_s"] >= 0
    assert got[1] == {"method": "checkpoint-threads", "error": "OSError: No such file"}


def test_each_run_sleeps_prepares_the_cache_wakes_reloads_and_compares_tokens() -> None:
    engine = Engine(broken="kernel-format")
    prepared: list[str] = []
    runs = probe.measure(
        engine,
        probe.plan(list(probe.METHODS), drop=True),
        [1, 2, 3],
        warm=lambda m: prepared.append(f"warm {m}"),
        drop=lambda: prepared.append("drop"),
    )
    assert engine.calls[:3] == ["sleep", "wake", "reload checkpoint"]
    # The kernel format is saved once, awake, before the first run that reads it.
    assert engine.calls.count("save") == 1 and engine.calls.index("save") == 12
    assert prepared == [
        "warm checkpoint",
        "drop",
        "warm checkpoint-threads",
        "drop",
        "warm state-copy",
        "drop",
        "warm kernel-format",
        "drop",
    ]
    assert [r.get("tokens_identical") for r in runs] == [True, True, False, False, True, True, None, None]
    assert runs[4]["kernel_format_bytes"] == 1234 and "kernel_format_saved_s" in runs[4]
    assert "kernel_format_bytes" not in runs[6]
    # What a reload says of itself goes into its run.
    assert runs[4]["copied"] == 7 and runs[5]["not_in_files"] == 1
    # A reload that fails is recorded with its error, and the runs after it still run.
    assert runs[6]["error"].startswith("AttributeError: `ModelRunner` has no parameter")
    assert "error" in runs[7] and "reload_s" not in runs[7]
    assert all(r["wake_s"] >= 0 and r["reload_s"] >= 0 for r in runs[:6])


def test_without_root_the_dropped_runs_are_left_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def refuse() -> None:
        raise PermissionError("Permission denied")

    monkeypatch.setattr(probe, "drop_page_cache", refuse)
    made: list[object] = []

    class Fake(Engine):
        def __init__(self, *a: object) -> None:
            super().__init__()
            made.append(a)

    monkeypatch.setattr(probe, "VllmEngine", Fake)
    cuda = SimpleNamespace(get_device_name=lambda i: "no GPU")
    monkeypatch.setitem(probe.sys.modules, "torch", SimpleNamespace(__version__="x", cuda=cuda))
    monkeypatch.setitem(probe.sys.modules, "vllm", SimpleNamespace(__version__="y"))
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"w" * 10)
    assert (
        probe.main(["--model", str(model), "--kernel-dir", str(tmp_path / "k"), "--out", str(tmp_path / "o")])
        == 0
    )
    doc = json.loads((tmp_path / "o" / "reload-probe.json").read_text())
    assert [r["method"] for r in doc["reads"]] == ["checkpoint", "checkpoint-threads"]
    assert [(r["method"], r["page_cache"]) for r in doc["runs"]] == [
        ("checkpoint", "warm"),
        ("checkpoint-threads", "warm"),
        ("state-copy", "warm"),
        ("kernel-format", "warm"),
    ]
    assert doc["checkpoint_bytes"] == 10 and len(made) == 1


def test_the_runs_so_far_are_told_after_each_run() -> None:
    # A lease can end mid-probe: main writes what it has each time it is told.
    told: list[list[str]] = []
    probe.measure(
        Engine(),
        probe.plan(["checkpoint", "state-copy"], drop=False),
        [1, 2, 3],
        warm=lambda m: None,
        drop=lambda: None,
        done=lambda runs: told.append([r["method"] for r in runs]),
    )
    assert told == [["checkpoint"], ["checkpoint", "state-copy"]]
