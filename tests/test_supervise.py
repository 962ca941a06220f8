"""``kernelbake serve`` supervising an engine: its output is read line by line for cache
evidence, signals reach it, and its exit code is ours."""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.plan import plan
from kernelbake.render import target_config
from kernelbake.runner import run
from kernelbake.runtime.compile import run_compile
from kernelbake.runtime.config import TargetConfig
from kernelbake.runtime.engines.vllm import evidence
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.support.fake_engine import FakeEngine, facts_for

_CHILD = textwrap.dedent(
    """
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: (print("child got SIGTERM", flush=True), sys.exit(3)))
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_on_line_sees_every_line_and_the_exit_code_passes_through() -> None:
    seen: list[str] = []
    result = run([sys.executable, "-c", "print('a'); print('b'); raise SystemExit(7)"], on_line=seen.append)
    assert seen == ["a\n", "b\n"]
    assert result.returncode == 7


def test_signals_are_forwarded_to_the_supervised_child(tmp_path: Path) -> None:
    supervisor = textwrap.dedent(
        f"""
        import sys
        from kernelbake.runner import run
        raise SystemExit(run([sys.executable, "-c", {_CHILD!r}], forward_signals=True).returncode)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", supervisor], stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while proc.stderr.readline() != "ready\n":
        assert time.monotonic() < deadline, "child never started"
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=30) == 3
    assert "child got SIGTERM" in rest


class _VllmLikeEngine(FakeEngine):
    """Serves by printing what vLLM prints when it loads a baked artifact."""

    def serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        lines = [
            "INFO [decorators.py:311] Directly load AOT compilation from path /x/model",
            "INFO:     Application startup complete.",
        ]
        return [sys.executable, "-c", f"print({chr(10).join(lines)!r}); raise SystemExit(0)"]

    def serve_watcher(self, cache_root: Path):  # type: ignore[no-untyped-def]
        return evidence.watcher(evidence.cache_dirs(cache_root, self.cache_kinds))


def test_serve_supervises_an_engine_with_a_watcher_and_reports_its_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (t,) = plan(load_spec(REPO / "images" / "tiny-llama-torch.yaml"), ["cpu"])
    config = dataclasses.replace(target_config(t), cache_root=str(tmp_path / "cache"))
    (tmp_path / "target.json").write_text(config.to_json())
    environ = {"KERNELBAKE_TARGET": str(tmp_path / "target.json"), "TMPDIR": str(tmp_path / "scratch")}
    engine = _VllmLikeEngine(facts_for(config.key))
    run_compile(RuntimeEnv.from_env(environ), engine=engine)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("kernelbake.runtime.engines.get_engine", lambda _engine: engine)
    monkeypatch.setattr("kernelbake.runtime.preflight.get_engine", lambda _engine: engine)
    assert main(["serve"]) == 0
    err = capsys.readouterr().err
    assert "kernelbake serve: baked caches valid" in err
    assert re.search(r"kernelbake serve: preflight took \d+\.\d s", err)
    assert "kernelbake serve: cache HIT: vLLM loaded the baked torch.compile artifact" in err
    assert "kernelbake serve: start-up compiled nothing: 0 new files in " in err
