"""``kernelbake serve`` supervising an engine: its output is read line by line for cache
evidence, signals reach it, and its exit code is ours."""

from __future__ import annotations

import dataclasses
import os
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
from kernelbake.contract.manifest import FileEntry
from kernelbake.contract.platform import Platform
from kernelbake.contract.target import TargetConfig
from kernelbake.plan import plan
from kernelbake.render import target_config
from kernelbake.runner import run
from kernelbake.runtime import gate as gate_mod
from kernelbake.runtime import integrity
from kernelbake.runtime.compile.stage import run_compile
from kernelbake.runtime.engines.vllm import evidence
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.runtime.gate import Gate
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.support.fake_engine import FakeEngine, pin_manifest, platform_for

# The handler uses os.write, not print: the signal can land while print("ready") is still
# flushing, and a second print into the same buffer raises "reentrant call".
_CHILD = textwrap.dedent(
    """
    import os, signal, time
    signal.signal(signal.SIGTERM, lambda *a: (os.write(1, b"child got SIGTERM\\n"), os._exit(3)))
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_on_line_sees_every_line_and_the_exit_code_passes_through() -> None:
    seen: list[str] = []
    result = run([sys.executable, "-c", "print('a'); print('b'); raise SystemExit(7)"], on_line=seen.append)
    assert seen == ["a\n", "b\n"]
    assert result.returncode == 7


def test_lines_for_the_watcher_alone_stay_off_the_console_but_not_out_of_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's prediction JSON is for serve's watcher and status file; the console has it in words."""
    mark = evidence.PREDICTION_MARK
    script = f"print('kernelbake: vllm: cache HIT'); print({mark!r} + '{{\"kinds\": {{}}}}')"
    seen: list[str] = []
    log = tmp_path / "engine.log"
    watcher = evidence.Watcher({})
    run([sys.executable, "-c", script], on_line=seen.append, log=log, hide=watcher.quiet)
    console = capsys.readouterr().err
    lines = console.splitlines()
    assert "kernelbake: vllm: cache HIT" in lines and not any(ln.startswith(mark) for ln in lines)
    assert len(seen) == 2 and seen[1].startswith(mark)
    assert mark in log.read_text()


def test_signals_are_forwarded_to_the_supervised_child(tmp_path: Path) -> None:
    supervisor = textwrap.dedent(
        f"""
        import sys
        from kernelbake.runner import run
        raise SystemExit(run([sys.executable, "-c", {_CHILD!r}], forward_signals=True).returncode)
        """
    )
    # Not reading its output, the supervisor leaves the child our stdout.
    proc = subprocess.Popen([sys.executable, "-c", supervisor], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while proc.stdout.readline() != "ready\n":
        assert time.monotonic() < deadline, "child never started"
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
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
        return evidence.watcher(evidence.cache_dirs(cache_root, self.declaration.cache_kinds))


def test_serve_supervises_an_engine_with_a_watcher_and_reports_its_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (t,) = plan(load_spec(REPO / "images" / "tiny-llama-torch.yaml"), ["cpu"])
    config = dataclasses.replace(target_config(t), cache_root=str(tmp_path / "cache"))
    (tmp_path / "target.json").write_text(config.to_json())
    environ = {"KERNELBAKE_UNSAFE_TARGET": str(tmp_path / "target.json"), "TMPDIR": str(tmp_path / "scratch")}
    engine = _VllmLikeEngine(platform_for(config.key))
    run_compile(RuntimeEnv.from_env(environ), engine=engine)
    pin_manifest(tmp_path / "target.json")
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("kernelbake.runtime.engines.get_engine", lambda _engine: engine)
    monkeypatch.setattr("kernelbake.runtime.serve.preflight.get_engine", lambda _engine: engine)
    assert main(["serve"]) == 0
    err = capsys.readouterr().err
    assert "kernelbake serve: baked caches valid" in err
    assert re.search(r"kernelbake serve: preflight took \d+\.\d s", err)
    assert "kernelbake serve: cache HIT: vLLM loaded the baked torch.compile artifact" in err
    assert "kernelbake serve: start-up compiled nothing: 0 new files in " in err


# -- the cache gate ---------------------------------------------------------------------------


def _gated_env(gate: Gate, **extra: str) -> RuntimeEnv:
    return RuntimeEnv.from_env({**gate.env(), **extra})


def test_the_gate_opens_on_warm_and_closes_with_the_reasons(tmp_path: Path) -> None:
    opened = Gate.create(tmp_path / "scratch")
    assert opened is not None
    opened.open()
    gate_mod.wait(_gated_env(opened))
    closed = Gate.create(tmp_path / "scratch")
    assert closed is not None
    closed.close(["cache integrity: inductor/a.so: sha256 1 but the manifest records 2"])
    with pytest.raises(gate_mod.GateClosed, match=r"failed verification \(cache integrity: inductor/a.so"):
        gate_mod.wait(_gated_env(closed))
    # Not started behind a gate: nothing to wait for.
    gate_mod.wait(RuntimeEnv.from_env({}))


def test_the_gate_stays_closed_when_serve_is_gone(tmp_path: Path) -> None:
    gate = Gate.create(tmp_path / "scratch")
    assert gate is not None
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    env = _gated_env(gate, KERNELBAKE_CACHE_GATE_OWNER=gone.stdout.strip())
    with pytest.raises(gate_mod.GateClosed, match="is gone; not opening the baked caches"):
        gate_mod.wait(env)


def test_a_hook_in_a_foreign_process_exits_at_a_closed_gate(tmp_path: Path) -> None:
    gate = Gate.create(tmp_path / "scratch")
    assert gate is not None
    gate.close(["tampered"])
    hook = "from kernelbake.runtime.engines.vllm import plugin; plugin.register(); print('went on')"
    # vLLM's loader would catch an exception from the hook; the hook ends the process itself.
    res = subprocess.run(
        [sys.executable, "-c", hook],
        env={**os.environ, **gate.env()},
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert res.returncode == gate_mod.GATE_CLOSED_EXIT
    assert "went on" not in res.stdout
    assert res.stderr.strip() == (
        "kernelbake: cache gate: the baked caches failed verification (tampered); "
        "stopping before opening any cache"
    )


# The engine of the serve tests below: it says when it reaches its gate, waits there, then
# reports where its caches are and what it read from them.
_GATED_ENGINE = textwrap.dedent(
    """
    import os, pathlib, sys
    from kernelbake.runtime import gate
    from kernelbake.runtime.env import RuntimeEnv
    env = RuntimeEnv.from_env()
    if env.gate is not None:
        pathlib.Path(os.environ["AT_GATE"]).touch()
    try:
        gate.wait(env)
    except gate.GateClosed as exc:
        print(f"engine: {exc}", flush=True)
        raise SystemExit(exc.return_code)
    cache = pathlib.Path(env.environ["FAKE_CACHE_DIR"])
    print(f"engine: opened {cache}: {len(list(cache.rglob('*.bin')))} files", flush=True)
    """
)


class _GatedEngine(FakeEngine):
    gated = True
    # Set by _serve_setup: the probe answers only once the engine waits at its gate, as
    # torch's import would take seconds while the engine imports its own.
    at_gate: Path | None = None

    def serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        return [sys.executable, "-c", _GATED_ENGINE]

    def probe(self) -> Platform:
        if self.gated and self.at_gate is not None:
            _wait_for(self.at_gate)
        return super().probe()


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, "the engine never reached its gate"
        time.sleep(0.01)


def _serve_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A baked fake bundle, serve pointed at it, and hashing that finishes only once the
    engine is waiting at its gate (so serve must start it before the verdict)."""
    (t,) = plan(load_spec(REPO / "images" / "tiny-llama.yaml"), ["cpu"])
    config = dataclasses.replace(target_config(t), cache_root=str(tmp_path / "cache"))
    (tmp_path / "target.json").write_text(config.to_json())
    at_gate = tmp_path / "at-gate"
    environ = {
        "KERNELBAKE_UNSAFE_TARGET": str(tmp_path / "target.json"),
        "TMPDIR": str(tmp_path / "scratch"),
        "AT_GATE": str(at_gate),
    }
    engine = _GatedEngine(platform_for(config.key))
    run_compile(RuntimeEnv.from_env(environ), engine=engine)
    pin_manifest(tmp_path / "target.json")
    engine.at_gate = at_gate
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("kernelbake.runtime.engines.get_engine", lambda _engine: engine)
    monkeypatch.setattr("kernelbake.runtime.serve.preflight.get_engine", lambda _engine: engine)
    real = integrity._digest_problem

    def after_the_engine_reached_its_gate(root: Path, entry: FileEntry) -> str | None:
        _wait_for(at_gate)
        return real(root, entry)

    monkeypatch.setattr(integrity, "_digest_problem", after_the_engine_reached_its_gate)
    return Path(config.cache_root), at_gate


def test_serve_starts_the_engine_while_probing_and_hashing_and_opens_its_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    root, at_gate = _serve_setup(tmp_path, monkeypatch)
    capfd.readouterr()
    assert main(["serve"]) == 0
    out, err = capfd.readouterr()
    assert at_gate.exists()
    lines = err.splitlines()
    assert lines[0].startswith("kernelbake serve: baked caches found (2 files, key sha256:")
    assert lines[0].endswith(
        "checking this machine and the sha256 of every file while the engine starts; "
        "it waits before opening any cache"
    )
    assert (
        "kernelbake serve: baked caches valid (exact match): 2 files, sha256 of every file checked in" in err
    )
    assert re.search(r"kernelbake serve: preflight took \d+\.\d s, while the engine started", err)
    assert out.splitlines() == [f"engine: opened {root / 'inductor'}: 2 files"]


def test_serve_on_a_machine_the_key_does_not_fit_stops_the_engine_at_its_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The speculative start skips the probe; the probe, answering while the engine waits,
    finds another GPU, so the gate closes and the engine starts again cold."""
    _, at_gate = _serve_setup(tmp_path, monkeypatch)
    key = TargetConfig.load(tmp_path / "target.json").key
    engine = _GatedEngine(platform_for(key, arch="sm_80", device="NVIDIA A100-SXM4-80GB"))
    engine.at_gate = at_gate
    monkeypatch.setattr("kernelbake.runtime.engines.get_engine", lambda _engine: engine)
    monkeypatch.setattr("kernelbake.runtime.serve.preflight.get_engine", lambda _engine: engine)
    (_argv, env), out, err = _serve_until_restarted(monkeypatch, capfd)
    assert at_gate.exists()
    assert out.startswith("engine: the baked caches failed verification (arch: baked 'x86_64', found 'sm_80'")
    assert "starting it again as preflight says" in err and "Traceback" not in err
    assert "KERNELBAKE_CACHE_GATE" not in env
    assert env["FAKE_CACHE_DIR"].startswith(str(tmp_path / "scratch" / "kernelbake-cold-"))


class _Exec(Exception):
    """Where serve would exec the engine (exec would replace the test process)."""


def _no_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    def execvpe(_file: str, argv: list[str], env: dict[str, str]) -> None:
        raise _Exec(argv, env)

    monkeypatch.setattr(os, "execvpe", execvpe)


def _serve_until_restarted(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> tuple[tuple[list[str], dict[str, str]], str, str]:
    """``serve`` up to where it starts the engine again, ungated: (argv, env), stdout, stderr."""
    _no_exec(monkeypatch)
    capfd.readouterr()
    with pytest.raises(_Exec) as restarted:
        main(["serve"])
    out, err = capfd.readouterr()
    return restarted.value.args, out, err


def test_serve_with_a_flipped_byte_stops_the_engine_at_its_gate_and_starts_it_cold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    root, at_gate = _serve_setup(tmp_path, monkeypatch)
    so = root / "inductor" / "g1" / "graph.bin"
    data = bytearray(so.read_bytes())
    data[7] ^= 0x80
    so.write_bytes(bytes(data))
    (argv, env), out, err = _serve_until_restarted(monkeypatch, capfd)
    # The first start reached its gate while the hashes were computed, and stopped there.
    assert at_gate.exists()
    assert re.fullmatch(
        r"engine: the baked caches failed verification \(cache integrity: inductor/g1/graph\.bin: "
        r"sha256 [0-9a-f]{64} but the manifest records [0-9a-f]{64}\); stopping before opening any cache\n",
        out,
    )
    reason = next(line for line in err.splitlines() if "cache integrity:" in line)
    assert re.fullmatch(
        r"kernelbake serve:   - cache integrity: inductor/g1/graph\.bin: "
        r"sha256 [0-9a-f]{64} but the manifest records [0-9a-f]{64}",
        reason,
    )
    assert "starting it again as preflight says" in err and "Traceback" not in err
    # Then serve starts it again, ungated, on a fresh directory.
    assert "KERNELBAKE_CACHE_GATE" not in env
    again = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    assert again.stdout.startswith(f"engine: opened {tmp_path / 'scratch'}/kernelbake-cold-")
    assert again.stdout.strip().endswith(": 0 files")


def test_serve_hashes_first_when_the_engine_has_no_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    _, at_gate = _serve_setup(tmp_path, monkeypatch)
    monkeypatch.setattr(_GatedEngine, "gated", False)
    monkeypatch.setattr(integrity, "_digest_problem", lambda root, entry: f"{entry.path}: sha256 x but y")
    _no_exec(monkeypatch)
    with pytest.raises(_Exec) as started:
        main(["serve"])
    err = capfd.readouterr().err
    assert not at_gate.exists()
    assert "WARNING: starting COLD" in err and "inductor/g0/graph.bin: sha256 x but y" in err
    assert "verifying the sha256" not in err
    env = started.value.args[1]
    assert "KERNELBAKE_CACHE_GATE" not in env
    assert env["FAKE_CACHE_DIR"].startswith(str(tmp_path / "scratch"))
