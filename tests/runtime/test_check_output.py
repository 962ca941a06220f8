"""``kernelbake check`` reads like a verdict: the word first (HIT, MISS, NO-COMPILE, FAILS, UNKNOWN),
this machine, what differs, that the engine was asked; the engine's own output goes to a log
file whose path is printed (on stderr only with ``-v``), and an engine that rejects the
arguments is quoted in its own words."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.contract.target import TargetConfig
from kernelbake.runtime import redact
from kernelbake.runtime.prediction import Change, KindVerdict, Outcome, Prediction, Source
from kernelbake.runtime.serve import preflight as pf
from tests.runtime.test_ask_engine import SECRET, AskingEngine, _bake, _miss
from tests.support.fake_engine import platform_for
from tests.support.runtime_target import write_target

NOISE = (
    "engine noise via print",
    "engine noise via stderr",
    "engine noise via fd 2",
    "engine noise from a child",
)


class NoisyEngine(AskingEngine):
    """Predicts like vLLM in ``check``: logs to stdout, warns on stderr, from C (fd 2) and from
    a child process, echoes the API key it was given; its parser rejects unknown arguments."""

    def predict(
        self, target: TargetConfig, user_args: Sequence[str], env: Mapping[str, str]
    ) -> Prediction | None:
        print(f"{NOISE[0]}; non-default args: {{'api_key': '{SECRET}'}}")
        print(NOISE[1], file=sys.stderr)
        os.write(2, f"{NOISE[2]}\n".encode())
        subprocess.run([sys.executable, "-c", f"print({NOISE[3]!r})"], check=True)
        parser = argparse.ArgumentParser(prog="vllm serve")
        parser.add_argument("--api-key")
        parser.parse_args(list(user_args))
        return super().predict(target, user_args, env)


@pytest.fixture
def target(tmp_path: Path) -> TargetConfig:
    return write_target(tmp_path, "tiny-llama.yaml")


@pytest.fixture
def baked_noisy(tmp_path: Path, target: TargetConfig, capfd: pytest.CaptureFixture[str]) -> NoisyEngine:
    """A baked bundle in ``tmp_path`` (its output read away) and an engine that predicts a MISS
    and writes its noise, which most of these tests ask."""
    _bake(tmp_path, target)
    capfd.readouterr()
    return NoisyEngine(platform_for(target.key), _miss())


def _check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: AskingEngine, *args: str) -> int:
    monkeypatch.setattr("kernelbake.runtime.engines.get_engine", lambda _e: engine)
    monkeypatch.setattr(pf, "get_engine", lambda _e: engine)
    monkeypatch.setenv("KERNELBAKE_UNSAFE_TARGET", str(tmp_path / "target.json"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    monkeypatch.setenv("VLLM_API_KEY", SECRET)
    return main(["check", *args])


def test_the_verdict_comes_first_names_this_machine_and_what_differs(
    tmp_path: Path,
    target: TargetConfig,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    baked_noisy: NoisyEngine,
) -> None:
    engine = baked_noisy
    assert _check(tmp_path, monkeypatch, engine, "--api-key", SECRET) == 6
    out = capfd.readouterr()
    lines = out.out.splitlines()
    assert lines[0] == "MISS: kernels compile at start (exit 6)"
    found = platform_for(target.key).fields()
    assert lines[1].startswith(f"this machine: {found['device']} ({found['arch']}), driver {found['driver']}")
    assert f"torch {found['torch']}" in lines[1] and f"python {found['python']}" in lines[1]
    assert lines[2:4] == [
        "differs (baked → this start):",
        f"  - inductor: env.VLLM_API_KEY: null → {redact.digest(SECRET)}",
    ]
    assert lines[4].startswith("asked vllm ") and " in this process (" in lines[4]
    # "valid" beside a MISS read as the opposite of the verdict.
    assert not [ln for ln in lines if "valid" in ln]
    assert "  prediction from vLLM's own cache keys: MISS" in lines


def test_the_engines_output_goes_to_a_log_file_whose_path_is_printed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    baked_noisy: NoisyEngine,
) -> None:
    engine = baked_noisy
    assert _check(tmp_path, monkeypatch, engine, "--api-key", SECRET) == 6
    out = capfd.readouterr()
    for noise in NOISE:
        assert noise not in out.out + out.err
    (said,) = [ln for ln in out.err.splitlines() if ln.startswith("kernelbake check: asking vllm ")]
    match = re.search(r"its output goes to (\S+\.log)$", said)
    assert match is not None, said
    log = Path(match.group(1))
    assert log.parent == tmp_path / "scratch"
    # A `docker run --rm` takes the file with it: the line says how to see or keep it.
    assert (
        f"its output: {log} (in the scratch directory, gone with a --rm container: "
        "-v prints it here, --log FILE on a mounted path keeps it)"
    ) in out.out
    text = log.read_text()
    for noise in NOISE:
        assert noise in text
    # What the engine echoes through Python is redacted on its way into the file.
    assert SECRET not in text + out.out + out.err and redact.digest(SECRET) in text


def test_verbose_shows_the_engines_output_on_stderr_and_writes_no_log(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    baked_noisy: NoisyEngine,
) -> None:
    engine = baked_noisy
    assert _check(tmp_path, monkeypatch, engine, "-v", "--json", "--api-key", SECRET) == 6
    out = capfd.readouterr()
    for noise in NOISE:
        assert noise in out.err and noise not in out.out
    # stdout stays the verdict alone.
    assert json.loads(out.out)["predicted"] == "miss"
    assert not list((tmp_path / "scratch").glob("kernelbake-check-*.log"))
    assert SECRET not in out.out + out.err


def test_log_names_the_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    baked_noisy: NoisyEngine,
) -> None:
    log = tmp_path / "check.log"
    engine = baked_noisy
    assert _check(tmp_path, monkeypatch, engine, "--log", str(log), "--api-key", SECRET) == 6
    out = capfd.readouterr().out
    assert NOISE[0] in log.read_text() and f"its output: {log}\n" in out and "--rm" not in out


def test_an_argument_the_engine_rejects_is_quoted_in_its_own_words(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    baked_noisy: NoisyEngine,
) -> None:
    engine = baked_noisy
    assert _check(tmp_path, monkeypatch, engine, "--max-num-seqz", "8") == 6
    lines = capfd.readouterr().out.splitlines()
    said = "vllm serve: error: unrecognized arguments: --max-num-seqz 8"
    assert lines[0] == (
        f"UNKNOWN: no verdict from the engine (the engine rejected the serve arguments: {said}); "
        "not a hit (exit 6)"
    )
    assert _check(tmp_path, monkeypatch, engine, "--json", "--max-num-seqz", "8") == 6
    doc = json.loads(capfd.readouterr().out)
    assert doc["prediction"]["note"] == f"the engine rejected the serve arguments: {said}"
    assert {k["note"] for k in doc["prediction"]["kinds"]} == {"the engine rejected the serve arguments"}


def test_no_compile_and_hit_are_their_own_words(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    _bake(tmp_path, target)
    off = (Change("compilation_config.mode", "VLLM_COMPILE", "NONE"),)
    eager = Prediction(
        Source.ENGINE,
        (
            KindVerdict("inductor", Outcome.SKIPPED, off, "compilation is off"),
            KindVerdict("triton", Outcome.HIT),
        ),
    )
    capfd.readouterr()
    assert _check(tmp_path, monkeypatch, AskingEngine(platform_for(target.key), eager)) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines[0] == (
        "NO-COMPILE: compilation is off for this start: nothing compiles, and the compile caches "
        "are not read (exit 0)"
    )
    hit = Prediction(
        Source.ENGINE, (KindVerdict("inductor", Outcome.HIT), KindVerdict("triton", Outcome.HIT))
    )
    assert _check(tmp_path, monkeypatch, AskingEngine(platform_for(target.key), hit)) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines[0] == "HIT: nothing compiles at start (exit 0)" and not lines[2].startswith("differs")
    debug = (Change("torch._inductor.config.trace.enabled (TORCH_COMPILE_DEBUG=1)", "unset", "True"),)
    writes = Prediction(
        Source.ENGINE,
        (
            KindVerdict("inductor", Outcome.WRITES, debug, "the knob writes"),
            KindVerdict("triton", Outcome.HIT),
        ),
    )
    assert _check(tmp_path, monkeypatch, AskingEngine(platform_for(target.key), writes)) == 0
    lines = capfd.readouterr().out.splitlines()
    assert lines[0] == (
        "HIT: nothing compiles at start; a knob outside the cache keys writes files into the caches (exit 0)"
    )


def test_a_cold_start_is_a_miss_that_says_why(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    _bake(tmp_path, target)
    capfd.readouterr()
    engine = AskingEngine(platform_for(target.key, arch="aarch64"), _miss())
    assert _check(tmp_path, monkeypatch, engine) == 6
    lines = capfd.readouterr().out.splitlines()
    assert lines[0] == "MISS: starting COLD; the baked caches are not used (exit 6)"
    assert lines[1].startswith("this machine: ") and "(aarch64)" in lines[1]
    assert lines[2] == "why:" and lines[3].startswith("  - arch: baked ")
    assert "the engine was not asked (the start is cold)" in lines


def test_settings_the_engine_refuses_are_their_own_word(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # vLLM 0.32's make_compiler refuses VLLM_USE_STANDALONE_COMPILE=0 under its mega artifact
    # (prediction.refused): no start, not a miss, and check says so with vLLM's words.
    _bake(tmp_path, target)
    why = "AssertionError: VLLM_USE_MEGA_AOT_ARTIFACT=1 requires VLLM_USE_STANDALONE_COMPILE=1"
    refused = Prediction(
        Source.ENGINE,
        (
            KindVerdict("inductor", Outcome.FAILS, (Change("vLLM's compiler", "built", why),), "refused"),
            KindVerdict("triton", Outcome.FAILS, (), "the engine does not start"),
        ),
    )
    capfd.readouterr()
    assert _check(tmp_path, monkeypatch, AskingEngine(platform_for(target.key), refused)) == 6
    lines = capfd.readouterr().out.splitlines()
    assert lines[0] == "FAILS: the engine refuses these settings and will not start (see differs) (exit 6)"
    assert f"  - inductor: vLLM's compiler: built → {why}" in lines
    assert _check(tmp_path, monkeypatch, AskingEngine(platform_for(target.key), refused), "--json") == 6
    assert json.loads(capfd.readouterr().out)["predicted"] == "fails"
