"""Helpers for integration tests that run real containers."""

from __future__ import annotations

import json
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
