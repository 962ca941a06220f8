"""``kernelbake check``: the preflight verdict for this machine, then the engine's own
prediction, asked in this process with the environment ``serve`` gives it; the engine's output
goes to a log file (``engine_output``). One result, which the CLI formats; ``to_json`` is
``check --json``."""

from __future__ import annotations

import dataclasses
import enum
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kernelbake.errors import KeyMismatch
from kernelbake.runtime import engines
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.runtime.redact import Redactor
from kernelbake.runtime.serve.engine_output import engine_output
from kernelbake.runtime.serve.preflight import Verdict, ask_engine, preflight


class Outcome(enum.Enum):
    """What the start would do, in one word (``check``'s first line)."""

    HIT = "HIT"
    MISS = "MISS"
    NO_COMPILE = "NO-COMPILE"
    # The engine refuses this start's settings: it exits before it opens a cache.
    FAILS = "FAILS"
    # The engine was asked and gave no verdict (it failed, or rejected the arguments).
    UNKNOWN = "UNKNOWN"


# ``Verdict.predicted`` (the prediction's level) → the word; a re-trace compiles nothing.
_OUTCOMES = {
    "hit": Outcome.HIT,
    "retrace": Outcome.HIT,
    # A debug knob writes files; it compiles nothing.
    "writes": Outcome.HIT,
    "no-compile": Outcome.NO_COMPILE,
    "miss": Outcome.MISS,
    "bypassed": Outcome.MISS,
    "unknown": Outcome.UNKNOWN,
    "fails": Outcome.FAILS,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Asked:
    """The engine's own verdict was asked for: which engine, how long it took, where its
    output went (None: to the terminal), and whether it answered at all."""

    engine: str
    seconds: float
    log: Path | None
    answered: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckResult:
    verdict: Verdict
    # None: the start is cold, so the engine was not asked.
    asked: Asked | None
    # Where the engine's output went while the machine was probed (None: the terminal).
    log: Path | None

    @property
    def outcome(self) -> Outcome:
        return _OUTCOMES.get(self.verdict.predicted, Outcome.UNKNOWN)

    @property
    def exit_code(self) -> int:
        """0 when nothing compiles at start, else the key-mismatch code (6)."""
        return 0 if self.verdict.predicted_hit else KeyMismatch.return_code

    @property
    def differs(self) -> list[str]:
        """What makes the start compile or cold: the problems that rule the caches out, else
        each factor the prediction found changed, by kind."""
        if not self.verdict.warm:
            return list(self.verdict.problems)
        return self.verdict.prediction.reasons if self.verdict.prediction else []

    def to_json(self) -> dict[str, Any]:
        return self.verdict.to_json()


def default_log(env: RuntimeEnv) -> Path | None:
    """A new file in the scratch directory for the engine's output; None where none can be
    made (the preflight then says what is wrong with the directory)."""
    try:
        env.scratch.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="kernelbake-check-", suffix=".log", dir=env.scratch)
    except OSError:
        return None
    os.close(fd)
    return Path(name)


def run_check(
    env: RuntimeEnv,
    user_args: Sequence[str],
    *,
    log: Path | None,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
) -> CheckResult:
    """The verdict, then (when warm) the engine's own; ``say`` tells the user, before it
    happens, that the engine is being asked and where its output goes."""
    with engine_output(log, Redactor.for_run(env.environ, user_args)):
        verdict = preflight(env, user_args)
    if not verdict.warm:
        return CheckResult(verdict=verdict, asked=None, log=log)
    engine = engines.get_engine(verdict.target.key.engine)
    name = f"{verdict.target.key.engine.value} {verdict.platform.software.engine_version}"
    where = f"its output goes to {log}" if log is not None else "its output follows"
    say(
        f"asking {name} in this process (its own argument parser and cache keys, with the "
        f"environment serve gives it; seconds to a minute): {where}"
    )
    started = clock()
    with engine_output(log, Redactor.for_run(verdict.env, user_args)) as heard:
        asked = ask_engine(engine, verdict, user_args, last_said=heard.rejection)
    return CheckResult(
        verdict=asked,
        asked=Asked(
            engine=name,
            seconds=clock() - started,
            log=log,
            answered=asked.prediction is not verdict.prediction,
        ),
        log=log,
    )
