"""CRIU, run through ``kernelbake.runner.run`` (injectable): its version, what ``criu check
--all`` finds missing (both in the snapshot key), ``dump`` and ``restore``.

The binary is the private prefix ``images/base/criu/install.sh`` writes (CRIU 4.2.1 through
trixie's loader: bookworm's 3.17 fails ``criu check`` on kernels >= 6.13, trixie's 4.1.1 cannot
dump a TCP socket on kernels >= 6.16)."""

from __future__ import annotations

import re
from pathlib import Path

from kernelbake.contract.key import NONE
from kernelbake.contract.snapshot import CRIU_COMMAND
from kernelbake.errors import EnvironmentProblem
from kernelbake.runner import Runner, TimedOut, run

DEFAULT_CRIU = Path(CRIU_COMMAND)
_VERSION = re.compile(r"Version:\s*(\S+)")
# "Warn  (criu/cr-check.c:824): Dirty tracking is OFF. ..." → the message alone. Only the
# feature checks' own lines (cr-check.c) describe the machine: the first CRIU run in a fresh
# container also says "Warn (criu/kerndat.c:1290): Can't keep kdat cache on non-tempfs" and later
# runs do not, which made a take's key and a restore's differ on the same machine (the CPU image,
# 2026-12-05: every restore refused).
_FINDING = re.compile(r"(?:Warn|Error)\s+\((?:[^):]*/)?cr-check\.c:\d+\):\s*(.+)")
# Options every dump and restore takes: file locks (vLLM's and torch's lock files) are kept;
# connections inside the tree (torch's TCPStore talks to itself over loopback) are dumped
# (clients of the serving port are not: take waits until there are none); files deleted while
# open (the engine's temporary files) are carried up to 1 GiB, or linked back in place.
_COMMON = ("--file-locks", "--tcp-established", "--ghost-limit", "1G", "--link-remap")
# "(02.517210) Error (criu/sk-unix.c:123): unix: Can't dump ..." → the message alone.
_ERROR = re.compile(r"Error\s+\([^)]*\):\s*(.+)")
# How much of a failed run's log its error repeats: the first errors are the cause (later ones
# are CRIU unwinding), and a log of -v4 runs to megabytes.
_MOST_ERRORS, _MOST_CHARS = 3, 200


def failure(log: Path) -> str:
    """Why a failed ``criu dump``/``restore`` failed, from its log: its first errors (at most
    three, each cut to 200 characters), else the log's last line; and where the whole log is."""
    try:
        with log.open(errors="replace") as fh:
            lines = [ln.rstrip() for ln in fh if ln.strip()]
    except FileNotFoundError:
        # CRIU stops before it opens its log when it lacks what it checks first (SYS_ADMIN
        # or CHECKPOINT_RESTORE: bench/results/snapshot_caps.json); it says why on stderr.
        return f"CRIU stopped before it wrote its log {log}; what it printed is above"
    except OSError as exc:
        return f"its log {log} could not be read ({exc.strerror or exc})"
    found = [m.group(1)[:_MOST_CHARS] for ln in lines if (m := _ERROR.search(ln))][:_MOST_ERRORS]
    said = "; ".join(found) if found else (lines[-1][:_MOST_CHARS] if lines else "the log is empty")
    return f"{said} (the whole log: {log})"


class RestoreTimedOut(EnvironmentProblem):
    """``criu restore`` ran past the restore's deadline and was killed."""


class Criu:
    def __init__(self, binary: Path = DEFAULT_CRIU, runner: Runner = run) -> None:
        self.binary = binary
        self._run = runner

    def _argv(self, *args: str) -> list[str]:
        return [str(self.binary), *args]

    def version(self) -> str:
        r = self._run(self._argv("--version"), capture=True)
        m = _VERSION.search(r.stdout + r.stderr)
        if r.returncode != 0 or m is None:
            raise EnvironmentProblem(
                f"{self.binary} --version failed (exit {r.returncode}); is CRIU installed "
                "(images/base/criu/install.sh)?"
            )
        return m.group(1)

    def features(self) -> str:
        """What ``criu check --all`` reports missing here, sorted, or ``none``."""
        r = self._run(self._argv("check", "--all"), capture=True)
        found = sorted({m.group(1).strip() for m in _FINDING.finditer(r.stdout + r.stderr)})
        return " | ".join(found) if found else NONE

    def dump(self, pid: int, images: Path, work: Path) -> tuple[bool, str]:
        """``criu dump`` of ``pid``'s tree into ``images`` (the tree is gone after success);
        (ok, log path)."""
        log = work / "dump.log"
        argv = self._argv("dump", "-t", str(pid), "-D", str(images), "-W", str(work), "-o", str(log), "-v4")
        return self._run([*argv, *_COMMON]).returncode == 0, str(log)

    def restore(
        self, images: Path, work: Path, pidfile: Path, timeout: float | None = None
    ) -> tuple[bool, str]:
        """``criu restore -d`` from ``images`` (read only), ended after ``timeout`` seconds (a
        restorer that hit a BUG waited for ever: capabilities it could not give back, under
        podman, 2026-12-06); the restored root's pid is written to ``pidfile``; (ok, log path)."""
        log = work / "restore.log"
        argv = self._argv(
            "restore", "-d", "-D", str(images), "-W", str(work), "-o", str(log), "-v4",
            "--pidfile", str(pidfile),
        )  # fmt: skip
        try:
            return self._run([*argv, *_COMMON], timeout=timeout).returncode == 0, str(log)
        except TimedOut:
            raise RestoreTimedOut(
                f"criu restore did not finish within {timeout:.0f} s: {failure(log)}"
            ) from None
