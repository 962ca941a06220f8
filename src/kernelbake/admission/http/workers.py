"""Several server processes on one port, so that one pod can use more than one core.

Each worker has its own listening socket on the same port (``SO_REUSEPORT``: the kernel spreads
connections across them) and its own event loop, verification pool and cache. The parent binds
every socket before forking (so ``--port 0`` works and a port in use fails before anything
starts), forwards SIGTERM/SIGINT, and if a worker dies on its own stops the others and exits
non-zero, so that Kubernetes restarts the pod rather than leaving it half up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from types import FrameType

log = logging.getLogger("kernelbake.admission.workers")


def listening_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` sockets listening on one port (the first picks it when ``port`` is 0)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if count > 1:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.listen(1024)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def run(sockets: Sequence[socket.socket], worker: Callable[[socket.socket], int]) -> int:
    """Run ``worker(sock)`` in a child process per socket; returns the exit code for the parent."""
    children = {_fork(index, sock, sockets, worker): index for index, sock in enumerate(sockets)}
    for sock in sockets:
        sock.close()

    stopping = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = 0
    while children:
        pid, status = os.wait()
        index = children.pop(pid, -1)
        if index < 0:
            continue
        exit_code = os.waitstatus_to_exitcode(status)
        if not stopping:
            log.error("worker %d exited (%d) on its own: stopping the others", index, exit_code)
            code = 1
            forward(signal.SIGTERM, None)
        elif exit_code != 0:
            code = code or 1
    return code


def _fork(
    index: int, sock: socket.socket, sockets: Sequence[socket.socket], worker: Callable[[socket.socket], int]
) -> int:
    """The child's pid; in the child, run ``worker`` on ``sock`` alone and exit with its code."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for other in sockets:
                if other is not sock:
                    other.close()
            code = worker(sock)
        except BaseException:
            log.exception("worker %d failed", index)
        finally:
            sys.stderr.flush()
            os._exit(code)
    return pid
