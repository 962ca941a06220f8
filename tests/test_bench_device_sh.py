"""bench/device.sh's start: a run gets this call's checkout, never the one an earlier call
installed (a context rendered again between calls once reached the device and not the run)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "bench" / "device.sh"


def _start(checkout: Path, root: Path, name: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DEVICE_RUNS": str(root / "runs"),
        "DEVICE_TREE": str(root / "tree"),
        "DEVICE_SITE": str(root / "site"),
    }
    return subprocess.run(
        ["bash", str(SCRIPT), "start", name, "--", *cmd],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def _ended(root: Path, name: str) -> str:
    rc = root / "runs" / name / "rc"
    for _ in range(200):
        if rc.exists() and rc.read_text().strip():
            return (root / "runs" / name / "stdout.log").read_text()
        time.sleep(0.05)
    raise AssertionError(f"{name} did not end")


def test_a_run_reads_the_context_of_its_own_call(tmp_path: Path) -> None:
    checkout, root = tmp_path / "checkout", tmp_path / "device"
    (checkout / ".gpu" / "ctx").mkdir(parents=True)
    (checkout / ".gpu" / "bundle").mkdir()
    (checkout / ".gpu" / "bundle" / "chunk1").write_text("big")
    (root / "site").mkdir(parents=True)
    (root / "tree" / ".gpu" / "ctx").mkdir(parents=True)
    (root / "tree" / ".gpu" / "ctx" / "wheel").write_text("rendered before the fix")  # install's copy
    (checkout / ".gpu" / "ctx" / "wheel").write_text("rendered again")
    started = _start(checkout, root, "one", "cat", ".gpu/ctx/wheel")
    assert started.returncode == 0, started.stderr
    assert _ended(root, "one") == "rendered again"
    assert not (root / "tree" / ".gpu" / "bundle").exists()


def test_start_refuses_a_changed_checkout_while_a_run_uses_the_tree(tmp_path: Path) -> None:
    checkout, root = tmp_path / "checkout", tmp_path / "device"
    (checkout / ".gpu" / "ctx").mkdir(parents=True)
    (checkout / ".gpu" / "ctx" / "wheel").write_text("a")
    (root / "site").mkdir(parents=True)
    gate = tmp_path / "gate"
    assert (
        _start(checkout, root, "long", "bash", "-c", f"until [ -f {gate} ]; do sleep 0.05; done").returncode
        == 0
    )
    # The same checkout: a second run may share the tree.
    same = _start(checkout, root, "beside", "cat", ".gpu/ctx/wheel")
    assert same.returncode == 0, same.stderr
    assert _ended(root, "beside") == "a"
    (checkout / ".gpu" / "ctx" / "wheel").write_text("b")
    refused = _start(checkout, root, "changed", "cat", ".gpu/ctx/wheel")
    assert refused.returncode == 2
    assert "unfinished runs (long) use" in refused.stderr and "wheel" in refused.stderr
    assert not (root / "runs" / "changed").exists()
    assert (root / "tree" / ".gpu" / "ctx" / "wheel").read_text() == "a"
    gate.touch()
    _ended(root, "long")
    assert _start(checkout, root, "after", "cat", ".gpu/ctx/wheel").returncode == 0
    assert _ended(root, "after") == "b"
