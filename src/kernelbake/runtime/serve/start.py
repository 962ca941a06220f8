"""How ``kernelbake serve`` starts the engine: after the preflight, or alongside it behind
the engine's cache gate, and supervised where the engine's own word on the caches is read
(the status file) or its gate answered. The CLI only parses arguments."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kernelbake.contract.target import TargetConfig
from kernelbake.runner import run
from kernelbake.runtime import shm
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.runtime.gate import GATE_CLOSED_EXIT, Gate

if TYPE_CHECKING:
    from kernelbake.runtime.engines import EngineRuntime
    from kernelbake.runtime.redact import Redactor
    from kernelbake.runtime.serve.preflight import Speculation, Verdict


def serve(env: RuntimeEnv, user_args: list[str]) -> int:
    """``kernelbake serve``: the preflight, then the engine, started on the caches it chose;
    where the baked caches can be guessed warm beforehand, the engine starts at once and
    waits at its cache gate while the preflight runs (``overlapped``)."""
    # Imported here, as the CLI did: tests stand a fake engine in for get_engine.
    from kernelbake.runtime.engines import get_engine
    from kernelbake.runtime.redact import Redactor
    from kernelbake.runtime.serve.preflight import preflight, speculate

    redact = Redactor.for_run(env.environ, user_args)
    started = time.monotonic()
    if (rc := _from_snapshot(env, user_args)) is not None:
        return rc
    target = TargetConfig.load(env.target_file)
    # Before anything is hashed or started: a /dev/shm too small for the engine is a start
    # that dies tens of seconds in, whatever the caches say.
    shm.require(get_engine(target.key.engine).shm_need(target, user_args, env.environ))
    guess = speculate(env)
    if guess is not None:
        engine = get_engine(guess.target.key.engine)
        gate = Gate.create(env.scratch) if engine.holds_at_gate(guess.env) else None
        if gate is not None:
            _say(
                [
                    f"baked caches found ({guess.manifest_files} files, key {guess.target.key.digest}): "
                    "checking this machine and the sha256 of every file while the engine starts; "
                    "it waits before opening any cache"
                ]
            )
            return _overlapped(engine, guess, env, gate, user_args, redact, started)
    verdict = preflight(env, user_args)
    engine = get_engine(verdict.target.key.engine)
    # Preflight sits on every replica's start path; its cost should be on record.
    _say([redact(x) for x in [*verdict.lines(), f"preflight took {time.monotonic() - started:.1f} s"]])
    return _start(engine, verdict, env, user_args, redact)


def _from_snapshot(env: RuntimeEnv, user_args: list[str]) -> int | None:
    """The restored engine's exit code where a mounted snapshot passes the gate and restores;
    None (the baked start) otherwise, including where none is mounted (one lstat)."""
    from kernelbake.contract.snapshot import SNAPSHOT_MANIFEST

    if not os.path.lexists(env.snapshot_root / SNAPSHOT_MANIFEST):
        return None
    from kernelbake.runtime.snapshot.criu import Criu
    from kernelbake.runtime.snapshot.driver import machine_driver
    from kernelbake.runtime.snapshot.restore import start_from_snapshot

    return start_from_snapshot(
        env, user_args, driver=machine_driver(), criu=Criu(env.criu), say=lambda line: _say([line])
    )


def _say(lines: list[str]) -> None:
    for line in lines:
        for part in line.split("\n"):
            print(f"kernelbake serve: {part}", file=sys.stderr, flush=True)


def _launch(
    engine: EngineRuntime,
    target: TargetConfig,
    cache_root: Path,
    engine_env: dict[str, str],
    user_args: list[str],
    gate_env: dict[str, str],
    *,
    redact: Redactor,
    status_file: Path | None,
    current: Callable[[], Verdict | None],
) -> int:
    """Start the engine on the caches at ``cache_root``. ``current`` is the verdict the status
    file records when the engine reports (the preflight's, once it has answered)."""
    argv = engine.serve_argv(target, user_args)
    watch = engine.serve_watcher(cache_root)
    if watch is None and not gate_env:
        _say([f"exec {' '.join(redact.argv(argv))}"])
        os.execvpe(argv[0], argv, engine_env)

    def report(line: str) -> None:
        if watch is not None and (message := watch(line)):
            _say([redact(message)])
            if (verdict := current()) is not None:
                _write_status(status_file, verdict, watch, redact)

    # Supervised rather than exec'd, to read the engine's own word on the caches, or to
    # answer at its cache gate. The engine's output is forwarded with secret values replaced
    # (vLLM echoes its arguments).
    return run(
        argv,
        env={**engine_env, **gate_env},
        on_line=report if watch else None,
        forward_signals=True,
        redact=redact,
        # The engine's machine-readable lines (vLLM's prediction JSON) are for the watcher and
        # the status file, not the console, which has the same verdict in words.
        hide=getattr(watch, "quiet", None),
    ).returncode


def _start(
    engine: EngineRuntime, verdict: Verdict, env: RuntimeEnv, user_args: list[str], redact: Redactor
) -> int:
    return _launch(
        engine,
        verdict.target,
        verdict.cache_root,
        verdict.env,
        user_args,
        {},
        redact=redact,
        status_file=env.status_file,
        current=lambda: verdict,
    )


def _fits(verdict: Verdict, guess: Speculation) -> bool:
    return verdict.warm and verdict.cache_root == guess.cache_root and verdict.env == guess.env


def _overlapped(
    engine: EngineRuntime,
    guess: Speculation,
    env: RuntimeEnv,
    gate: Gate,
    user_args: list[str],
    redact: Redactor,
    started: float,
) -> int:
    """The engine starts now, on the baked caches, and holds at its cache gate; the preflight
    (the probe, which imports the engine's libraries, and the sha256 of every file) runs
    meanwhile. The gate opens only on a warm verdict for this very environment; otherwise
    the engine stops there without having opened a cache, and starts again as the preflight
    says (cold, on a fresh directory)."""
    from kernelbake.runtime.serve.preflight import preflight

    final: list[Verdict] = []
    failure: list[BaseException] = []

    def decide() -> None:
        try:
            final.append(preflight(env, user_args, engine=engine))
        except BaseException as exc:
            failure.append(exc)
        verdict = final[0] if final else None
        if verdict is not None and _fits(verdict, guess):
            gate.open()
        elif verdict is not None and verdict.warm:
            gate.close(["the preflight chose other caches or another environment than the engine has"])
        else:
            gate.close(verdict.problems if verdict else [f"the preflight failed: {failure[0]}"])
        if verdict is not None:
            _say([redact(x) for x in verdict.lines()])
            _say([f"preflight took {time.monotonic() - started:.1f} s, while the engine started"])

    def current() -> Verdict | None:
        decider.join()
        return final[0] if final else None

    decider = threading.Thread(target=decide, name="kernelbake-preflight", daemon=True)
    decider.start()
    rc = _launch(
        engine,
        guess.target,
        guess.cache_root,
        guess.env,
        user_args,
        gate.env(),
        redact=redact,
        status_file=env.status_file,
        current=current,
    )
    decider.join()
    if failure:
        raise failure[0]
    verdict = final[0]
    if _fits(verdict, guess) or rc != GATE_CLOSED_EXIT:
        return rc
    _say(
        ["the engine stopped at its cache gate before opening any cache; starting it again as preflight says"]
    )
    return _start(engine, verdict, env, user_args, redact)


def _write_status(
    path: Path | None, verdict: Verdict, watch: Callable[[str], str | None], redact: Callable[[str], str]
) -> None:
    """The JSON status: the preflight, the engine's prediction and what the engine then did
    (an engine's watcher that knows it has a ``status()``)."""
    status = getattr(watch, "status", None)
    if path is None or not callable(status):
        return
    doc = {"preflight": verdict.to_json(), **status()}
    with contextlib.suppress(OSError):
        path.write_text(redact(json.dumps(doc, indent=1, sort_keys=True, default=str)) + "\n")
