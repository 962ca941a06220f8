"""A real Debian docker-registry (distribution 2.8) on 127.0.0.1, one per test session."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.support.docker import remove_local_names

REGISTRY_BIN = "/usr/bin/docker-registry"

# A fixed http.secret: otherwise docker-registry makes a random one and warns about it.
CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
  secret: kernelbake-tests
"""


# Every address a registry of this process listened on; the session's end lists any local
# Docker name still under one (tests/conftest.py), since such a name points at nothing.
STARTED: list[str] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_registry(workdir: Path, port: int | None = None, *, auth: str = "") -> Iterator[str]:
    """Start a registry storing under ``workdir``; yields ``127.0.0.1:<port>``.

    ``auth`` is the config's ``auth:`` section (YAML), for a registry that demands credentials.
    """
    if not shutil.which(REGISTRY_BIN):
        raise RuntimeError(f"{REGISTRY_BIN} missing: apt-get install docker-registry (make deps does)")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.yml"
    config.write_text(CONFIG.format(root=workdir / "data", port=port) + auth)
    log = (workdir / "registry.log").open("w")
    proc = subprocess.Popen([REGISTRY_BIN, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    addr = f"127.0.0.1:{port}"
    STARTED.append(addr)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://{addr}/v2/", timeout=1):
                    break
            except urllib.error.HTTPError as exc:
                exc.close()
                break  # 401 from a registry with auth: it is up
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"registry did not start; see {workdir / 'registry.log'}") from None
                time.sleep(0.1)
        yield addr
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
        # What builds and pushes tagged in the shared daemon under this address would point at
        # a registry that no longer exists.
        remove_local_names(f"{addr}/")
