"""Stand-ins for CRIU and the driver in the gate's tests: what they were asked, and, for a
restore, a real process tree standing in for the restored one (a /health server)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from kernelbake.contract.key import NONE
from kernelbake.runtime.snapshot.criu import RestoreTimedOut
from kernelbake.runtime.snapshot.driver import DeviceFacts, DeviceMemory

# Serves /health and /is_sleeping (200) on PORT for SECONDS, then exits 0; with HEALTHY=0 they
# answer 503. POSTs
# (vLLM's /wake_up, /collective_rpc) are answered 200, or 500 with RELOAD=0 for the reload, and
# each is appended to CALLS as "path body".
HEALTH_SERVER = r"""
import http.server, sys, threading
port, seconds, healthy = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
reload_ok, calls = sys.argv[4] == "1", sys.argv[5]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if healthy and self.path in ("/health", "/is_sleeping") else 503); self.end_headers()
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        with open(calls, "a") as fh:
            fh.write(f"{self.path} {body}\n")
        self.send_response(500 if self.path == "/collective_rpc" and not reload_ok else 200); self.end_headers()
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
threading.Timer(seconds, s.shutdown).start()
s.serve_forever()
"""


# The cause a failed stand-in restore writes in its log, which the refusal must repeat.
RESTORE_ERROR = "File /opt/kernelbake/x.best_config has bad size 273 (expect 274)"


class FakeDriver:
    def __init__(self, gpu: str = NONE, driver: str = NONE, api: str = NONE, count: int = 0) -> None:
        self._facts = DeviceFacts(gpu=gpu, gpu_count=count, driver=driver, cuda_driver_api=api)
        self.checkpointed: list[int] = []
        self.restored: list[int] = []
        # What ``memory`` answers, one call after another (the last again once they run out);
        # none: a machine whose GPUs cannot be asked.
        self.memories: list[tuple[DeviceMemory, ...]] = []

    def facts(self) -> DeviceFacts:
        return self._facts

    def memory(self) -> tuple[DeviceMemory, ...]:
        if not self.memories:
            return ()
        return self.memories.pop(0) if len(self.memories) > 1 else self.memories[0]

    def checkpoint(self, pid: int) -> None:
        self.checkpointed.append(pid)

    def restore(self, pid: int) -> None:
        self.restored.append(pid)


class FakeCriu:
    """``restore`` starts HEALTH_SERVER as the restored root (a child of the test, as the
    subreaper makes the real one) unless ``restore_ok`` is False."""

    binary = Path("/fake/criu")

    def __init__(
        self,
        port: int,
        *,
        restore_ok: bool = True,
        healthy: bool = True,
        serve_s: float = 1.0,
        reload_ok: bool = True,
        hangs: bool = False,
    ) -> None:
        self.port = port
        self.restore_ok = restore_ok
        # A CRIU that never finishes: the restore's own timeout ends it (RestoreTimedOut).
        self.hangs = hangs
        self.timeouts: list[float | None] = []
        self.healthy = healthy
        self.serve_s = serve_s
        self.reload_ok = reload_ok
        # What the restored engine was sent after /health (written by the stand-in).
        self.calls: Path | None = None
        self.restores: list[Path] = []
        # A bare pid, as CRIU's pidfile gives one: the gate reaps it, so no Popen is left to
        # warn that its child ran on.
        self.child: int | None = None

    def ended(self) -> bool:
        """Whether the restored root has ended (reaped here if the gate left it a zombie)."""
        assert self.child is not None
        try:
            pid, _ = os.waitpid(self.child, os.WNOHANG)
        except ChildProcessError:
            return True  # the gate reaped it
        return pid != 0

    def version(self) -> str:
        return "4.1.1"

    def features(self) -> str:
        return NONE

    def dump(self, pid: int, images: Path, work: Path) -> tuple[bool, str]:
        raise AssertionError("the gate never dumps")

    def restore(
        self, images: Path, work: Path, pidfile: Path, timeout: float | None = None
    ) -> tuple[bool, str]:
        self.restores.append(images)
        self.timeouts.append(timeout)
        if self.hangs:
            raise RestoreTimedOut(f"criu restore did not finish within {timeout:.0f} s: {RESTORE_ERROR}")
        if not self.restore_ok:
            # As CRIU leaves it: warnings, the cause, then errors of its unwinding.
            log = work / "restore.log"
            log.write_text(
                "(00.010) Warn  (criu/kerndat.c:1): dirty tracking is off\n"
                f"(00.020) Error (criu/files-reg.c:2190): {RESTORE_ERROR}\n"
                "(00.030) Error (criu/cr-restore.c:2480): Restoring FAILED.\n"
            )
            return False, str(log)
        self.child = os.posix_spawn(
            sys.executable,
            [
                sys.executable,
                "-c",
                HEALTH_SERVER,
                str(self.port),
                str(self.serve_s),
                "1" if self.healthy else "0",
                "1" if self.reload_ok else "0",
                str(self.calls or "/dev/null"),
            ],
            os.environ,
        )
        pidfile.write_text(str(self.child))
        return True, str(work / "restore.log")
