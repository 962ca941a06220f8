"""Helpers for integration tests that run real containers."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

CPU_BASE = "kernelbake/cpu-base:bookworm-torch2.13.0"
VLLM_CPU_BASE = "kernelbake/vllm-cpu-base:bookworm-vllm0.32.0"


def docker(*args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(
            f"docker {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
        )
    return res


def require_cpu_base(image: str = CPU_BASE) -> None:
    if docker("image", "inspect", image, check=False).returncode != 0:
        raise AssertionError(f"{image} is missing: run `make cpu-base` (make test does)")


def ready_line(stdout: str) -> dict[str, Any]:
    """The torch server's JSON status line."""
    for line in stdout.splitlines():
        if line.startswith("{") and '"event": "ready"' in line:
            doc: dict[str, Any] = json.loads(line)
            return doc
    raise AssertionError(f"no ready line in:\n{stdout}")


def local_names(prefix: str) -> list[str]:
    """The names in this Docker daemon's image store that start with ``prefix`` (e.g. a test
    registry's ``127.0.0.1:PORT/``): ``repo:tag``, or ``repo@digest`` for an image pulled by
    digest only. Empty when there is no docker or no daemon: then nothing can have been tagged."""
    if shutil.which("docker") is None:
        return []
    res = subprocess.run(
        ["docker", "image", "ls", "--digests", "--format", "{{.Repository}}\t{{.Tag}}\t{{.Digest}}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if res.returncode != 0:
        return []
    names = []
    for line in res.stdout.splitlines():
        repo, tag, digest = [*line.split("\t"), "", ""][:3]
        if not repo.startswith(prefix):
            continue
        if tag not in ("", "<none>"):
            names.append(f"{repo}:{tag}")
        elif digest not in ("", "<none>"):
            names.append(f"{repo}@{digest}")
    return sorted(set(names))


def remove_local_names(prefix: str) -> list[str]:
    """Untag every name ``local_names(prefix)`` lists (the images go once nothing else names
    them); returns the names still there, e.g. one a stopped container holds."""
    names = local_names(prefix)
    if names:
        subprocess.run(["docker", "rmi", *names], capture_output=True, text=True, timeout=300)
    return local_names(prefix) if names else []
