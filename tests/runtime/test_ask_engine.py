"""Preflight, check and serve with the engine's own verdict: a device-name change keeps the
caches that do not key on it, check reports the engine's prediction (exit 6 on a predicted
miss), serve records the prediction and the evidence in its JSON status, and no secret value
reaches any output or file."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from kernelbake.cli import main
from kernelbake.contract.layout import CacheKind, kind_dir
from kernelbake.contract.manifest import FileEntry
from kernelbake.contract.platform import Platform
from kernelbake.contract.target import TargetConfig
from kernelbake.runtime import integrity, redact
from kernelbake.runtime.bundle import read_manifest
from kernelbake.runtime.compile.stage import run_compile
from kernelbake.runtime.engines import CompileResult
from kernelbake.runtime.engines.vllm import evidence
from kernelbake.runtime.prediction import Change, KindVerdict, Outcome, Prediction, Source
from kernelbake.runtime.serve import preflight as pf
from tests.support.fake_engine import FakeEngine, pin_manifest, platform_for
from tests.support.runtime_target import runtime_env as _env
from tests.support.runtime_target import write_target

SECRET = "sk-test-0123456789"
# As the compile stage records it (engines.vllm.identity): the device name sits in Inductor's
# system factors, Triton keys on the arch and ptxas.
IDENTITY = {
    "config": {"hash": "c"},
    "env": {"hash": "e"},
    "compiler": {"hash": "x", "factors": {"system": {"device": {"name": "cpu"}}}},
    "triton": {"backend": "ptxas-90"},
}


class AskingEngine(FakeEngine):
    """A fake engine that records an identity, predicts, and watches like vLLM's."""

    def __init__(self, platform: Platform, prediction: Prediction | None = None) -> None:
        super().__init__(platform)
        self.prediction = prediction
        self.asked_with: Mapping[str, str] | None = None

    def compile(self, target: TargetConfig, root: Path) -> CompileResult:
        result = super().compile(target, root)
        p = kind_dir(root, CacheKind.TRITON) / "k.cubin"
        p.write_bytes(b"k")
        return dataclasses.replace(result, report={**result.report, "engine_identity": IDENTITY})

    def prediction_env(self, baked_root: Path) -> dict[str, str]:
        return {"FAKE_BAKED_MANIFEST": str(baked_root / "manifest.json")}

    def hashed_env_names(self) -> tuple[str, ...]:
        return ("FAKE_HASHED", "VLLM_API_KEY")

    def predict(
        self, target: TargetConfig, user_args: Sequence[str], env: Mapping[str, str]
    ) -> Prediction | None:
        self.asked_with = env
        return self.prediction

    def serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        lines = [
            evidence.PREDICTION_MARK + json.dumps(self.prediction.to_json() if self.prediction else None),
            f"non-default args: {{'api_key': ['{SECRET}']}}",
            "Compiling a graph for compile range (1, 16)",
            "Application startup complete.",
        ]
        # Start-up writes one file into a cache directory before it is ready.
        write = "import os; open(os.path.join(os.environ['FAKE_CACHE_DIR'], 'new.bin'), 'w').write('n');"
        code = write + "".join(f"print({line!r}, flush=True);" for line in lines)
        return [sys.executable, "-c", code, *user_args]

    def serve_watcher(self, cache_root: Path) -> evidence.Watcher:  # type: ignore[override]
        return evidence.watcher(evidence.cache_dirs(cache_root, self.declaration.cache_kinds))


@pytest.fixture
def target(tmp_path: Path) -> TargetConfig:
    return write_target(tmp_path, "tiny-llama.yaml")


def _bake(tmp_path: Path, target: TargetConfig) -> None:
    run_compile(_env(tmp_path), engine=AskingEngine(platform_for(target.key)))
    pin_manifest(tmp_path / "target.json")


def _hit() -> Prediction:
    return Prediction(
        Source.ENGINE, (KindVerdict("inductor", Outcome.HIT), KindVerdict("triton", Outcome.HIT))
    )


def _miss() -> Prediction:
    change = Change("env.VLLM_API_KEY", "null", redact.digest(SECRET))
    return Prediction(
        Source.ENGINE, (KindVerdict("inductor", Outcome.MISS, (change,)), KindVerdict("triton", Outcome.HIT))
    )


def test_a_device_name_change_on_the_same_arch_keeps_the_bundle_and_predicts_per_kind(
    tmp_path: Path, target: TargetConfig
) -> None:
    _bake(tmp_path, target)
    v = pf.preflight(_env(tmp_path), engine=AskingEngine(platform_for(target.key, device="cpu-2")))
    assert v.warm and v.cache_root == Path(target.cache_root)
    assert v.prediction is not None and v.prediction.source is Source.FALLBACK
    outcomes = {k.kind: k.outcome for k in v.prediction.kinds}
    assert outcomes == {"inductor": Outcome.MISS, "triton": Outcome.HIT}
    assert not v.predicted_hit
    assert "FAKE_BAKED_MANIFEST" in v.env


def test_another_arch_still_starts_cold(tmp_path: Path, target: TargetConfig) -> None:
    _bake(tmp_path, target)
    v = pf.preflight(
        _env(tmp_path), engine=AskingEngine(platform_for(target.key, device="cpu-2", arch="aarch64"))
    )
    assert not v.warm and v.cache_root != Path(target.cache_root)


def _check(
    tmp_path: Path, target: TargetConfig, prediction: Prediction, monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[int, AskingEngine]:
    engine = AskingEngine(platform_for(target.key), prediction)
    monkeypatch.setattr("kernelbake.runtime.engines.get_engine", lambda _e: engine)
    monkeypatch.setattr(pf, "get_engine", lambda _e: engine)
    monkeypatch.setenv("KERNELBAKE_UNSAFE_TARGET", str(tmp_path / "target.json"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    monkeypatch.setenv("VLLM_API_KEY", SECRET)
    return main(["check", "--json", *args]), engine


def test_check_reports_the_engines_prediction_and_exits_6_on_a_miss(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _bake(tmp_path, target)
    capsys.readouterr()
    rc, engine = _check(tmp_path, target, _miss(), monkeypatch, "--api-key", SECRET)
    out = capsys.readouterr()
    assert rc == 6
    doc: dict[str, Any] = json.loads(out.out)
    assert doc["predicted"] == "miss" and doc["verdict"] == "warm"
    assert doc["prediction"]["reasons"] == [f"inductor: env.VLLM_API_KEY: null → {redact.digest(SECRET)}"]
    # The engine was asked with the environment serve gives it (pins, cache dirs, marker).
    assert engine.asked_with is not None and "FAKE_CACHE_DIR" in engine.asked_with
    assert SECRET not in out.out + out.err


def test_check_exits_0_when_the_engine_predicts_every_hit(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _bake(tmp_path, target)
    capsys.readouterr()
    rc, _engine = _check(tmp_path, target, _hit(), monkeypatch)
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["prediction"]["source"] == "engine"


def test_serve_records_a_wrong_prediction_in_its_status_and_leaks_no_secret(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    _bake(tmp_path, target)
    engine = AskingEngine(platform_for(target.key), _hit())
    monkeypatch.setattr("kernelbake.runtime.engines.get_engine", lambda _e: engine)
    monkeypatch.setattr(pf, "get_engine", lambda _e: engine)
    status = tmp_path / "status.json"
    monkeypatch.setenv("KERNELBAKE_UNSAFE_TARGET", str(tmp_path / "target.json"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    monkeypatch.setenv("KERNELBAKE_STATUS", str(status))
    monkeypatch.setenv("VLLM_API_KEY", SECRET)
    assert main(["serve", "--api-key", SECRET]) == 0
    out = capfd.readouterr()
    assert "prediction wrong: predicted hit for inductor, vLLM compiled (1 new files in inductor)" in out.err
    doc = json.loads(status.read_text())
    assert doc["prediction"]["predicted"] == "hit"
    assert doc["prediction_wrong"] and doc["evidence"]["log"]["torch_compile_hit"] is False
    for text in (out.out, out.err, status.read_text()):
        assert SECRET not in text
    assert redact.digest(SECRET) in out.err


def test_a_hashed_secret_is_stored_as_a_digest_and_still_compares(
    tmp_path: Path, target: TargetConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    run_compile(_env(tmp_path, VLLM_API_KEY=SECRET), engine=AskingEngine(platform_for(target.key)))
    pin_manifest(tmp_path / "target.json")
    manifest = (Path(target.cache_root) / "manifest.json").read_text()
    assert SECRET not in manifest and redact.digest(SECRET) in manifest
    same = pf._hashed_env_notes(
        read_manifest(Path(target.cache_root)), {"FAKE_HASHED": "1", "VLLM_API_KEY": SECRET}
    )
    assert same == []
    (note,) = pf._hashed_env_notes(
        read_manifest(Path(target.cache_root)), {"FAKE_HASHED": "1", "VLLM_API_KEY": "other-secret"}
    )
    assert "other-secret" not in note and SECRET not in note and redact.digest("other-secret") in note
    assert SECRET not in capsys.readouterr().out


class GatedAskingEngine(AskingEngine):
    """Like vLLM's plugin: waits at the cache gate first, then states its prediction."""

    gated = True

    def serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        exe, flag, code, *rest = super().serve_argv(target, user_args)
        wait = (
            "from kernelbake.runtime import gate; from kernelbake.runtime.env import RuntimeEnv;"
            "import os, pathlib; env = RuntimeEnv.from_env();"
            "print('engine: held at gate', env.gate is not None, flush=True);"
            "pathlib.Path(os.environ['AT_GATE']).touch(); gate.wait(env);"
        )
        return [exe, flag, wait + code, *rest]


def test_serve_holds_the_gate_then_checks_the_prediction_against_the_settled_verdict(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    _bake(tmp_path, target)
    engine = GatedAskingEngine(platform_for(target.key), _hit())
    monkeypatch.setattr("kernelbake.runtime.engines.get_engine", lambda _e: engine)
    monkeypatch.setattr(pf, "get_engine", lambda _e: engine)
    status = tmp_path / "status.json"
    at_gate = tmp_path / "at-gate"
    monkeypatch.setenv("KERNELBAKE_UNSAFE_TARGET", str(tmp_path / "target.json"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    monkeypatch.setenv("KERNELBAKE_STATUS", str(status))
    monkeypatch.setenv("VLLM_API_KEY", SECRET)
    monkeypatch.setenv("AT_GATE", str(at_gate))
    real = integrity._digest_problem

    def once_the_engine_is_at_its_gate(root: Path, entry: FileEntry) -> str | None:
        # The hashing finishes only after the engine started, so serve must use the gate.
        deadline = time.monotonic() + 30
        while not at_gate.exists():
            assert time.monotonic() < deadline, "the engine never reached its gate"
            time.sleep(0.01)
        return real(root, entry)

    monkeypatch.setattr(integrity, "_digest_problem", once_the_engine_is_at_its_gate)
    assert main(["serve", "--api-key", SECRET]) == 0
    out = capfd.readouterr()
    assert "engine: held at gate True" in out.err
    assert "baked caches found (3 files, key sha256:" in out.err
    assert "checking this machine and the sha256 of every file while the engine starts" in out.err
    assert "prediction wrong: predicted hit for inductor, vLLM compiled (1 new files in inductor)" in out.err
    doc = json.loads(status.read_text())
    # The status holds the verdict the gate was opened with, not the one still hashing.
    assert doc["preflight"]["verdict"] == "warm" and "sha256 of every file" in doc["preflight"]["integrity"]
    assert doc["prediction"]["predicted"] == "hit" and doc["prediction_wrong"]
    for text in (out.out, out.err, status.read_text()):
        assert SECRET not in text
