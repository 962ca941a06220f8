"""The cache gate: an engine started while its caches are still being hashed waits here,
before it opens any cache, until ``serve`` has written the verdict.

Hashing every cache file takes seconds on a large bundle; the engine's own start (Python
imports, model construction) takes longer and reads no cache. So ``serve`` starts both at
once and the engine holds at the gate, placed by each engine where it would first open a
cache: the torch server before it compiles, vLLM's plugin hook (which vLLM runs in every
process it starts, before it builds any config). ``warm`` lets it through; anything else
stops the engine with exit code ``GATE_CLOSED_EXIT`` and ``serve`` starts it again, cold.

The verdict is a file in a private directory (``mkdtemp``, mode 0700), written atomically,
because vLLM's engine-core and worker processes are spawned fresh and inherit the
environment but no pipes. Fail closed: an engine whose ``serve`` died before answering, or a
verdict it cannot read, does not go on.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from kernelbake.errors import KeyMismatch
from kernelbake.runtime.env import GATE_ENV, GATE_OWNER_ENV, RuntimeEnv

WARM = "warm"
COLD = "cold"
GATE_CLOSED_EXIT = KeyMismatch.return_code
_VERDICT = "verdict"


class GateClosed(KeyMismatch):
    """The caches failed verification (or nobody answered): this engine process must stop
    before it opens any cache."""


class Gate:
    """The side of ``serve``: where the verdict goes, and the variables that point an engine at it."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / _VERDICT

    @classmethod
    def create(cls, scratch: Path) -> Gate | None:
        """``None`` without a writable scratch directory (``serve`` then hashes before it starts the engine)."""
        try:
            scratch.mkdir(parents=True, exist_ok=True)
            return cls(Path(tempfile.mkdtemp(prefix="kernelbake-gate-", dir=scratch)))
        except OSError:
            return None

    def env(self) -> dict[str, str]:
        return {GATE_ENV: str(self.path), GATE_OWNER_ENV: str(os.getpid())}

    def _write(self, text: str) -> None:
        tmp = self.path.with_name(f".{_VERDICT}.tmp")
        tmp.write_text(text)
        tmp.replace(self.path)

    def open(self) -> None:
        self._write(WARM + "\n")

    def close(self, reasons: Iterable[str]) -> None:
        self._write("\n".join([COLD, *reasons]) + "\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait(env: RuntimeEnv, *, poll_s: float = 0.005) -> None:
    """Return once ``serve`` says the caches are verified; no-op when not started behind a gate.

    Raises ``GateClosed`` otherwise; callers end the process without touching a cache.
    """
    if env.gate is None:
        return
    while True:
        try:
            text = env.gate.read_text()
            break
        except FileNotFoundError:
            if env.gate_owner is None or not _alive(env.gate_owner):
                raise GateClosed(
                    f"no cache verdict at {env.gate} and the kernelbake serve that was to write it "
                    "is gone; not opening the baked caches"
                ) from None
            time.sleep(poll_s)
        except OSError as exc:
            raise GateClosed(f"cannot read the cache verdict {env.gate}: {exc.strerror}") from None
    first, _, rest = text.partition("\n")
    if first != WARM:
        reasons = "; ".join(line for line in rest.splitlines() if line) or "no reason given"
        raise GateClosed(
            f"the baked caches failed verification ({reasons}); stopping before opening any cache"
        )


def hold_or_exit(env: RuntimeEnv | None = None) -> None:
    """``wait`` for hooks that run inside someone else's process (vLLM's plugin loader):
    any failure ends the process at once, since an exception could be caught and logged by
    the host and the engine would go on to read the caches."""
    try:
        wait(env or RuntimeEnv.from_env())
    except BaseException as exc:  # fail closed, whatever went wrong
        with contextlib.suppress(Exception):
            print(f"kernelbake: cache gate: {exc}", file=sys.stderr, flush=True)
        os._exit(GATE_CLOSED_EXIT)
