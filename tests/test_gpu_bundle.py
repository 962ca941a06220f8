"""bench/gpu-bundle/install.sh and bench/gpu_bundle_check.py, off the device: the pieces join
only when all are there with bundle.json's digest, and the check refuses a torch that is not
the bundle's."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import gpu_bundle_check

INSTALL = REPO / "bench" / "gpu-bundle" / "install.sh"


def _stash(tmp_path: Path) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        data = b"__version__ = '2.13.0'\n" * 200
        info = tarfile.TarInfo("./torch/__init__.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    stash = tmp_path / "stash"
    stash.mkdir()
    half = len(blob) // 2
    (stash / "site.tar.xz.00").write_bytes(blob[:half])
    (stash / "site.tar.xz.01").write_bytes(blob[half:])
    doc = {"release": "0.32.0", "pieces": 2, "sha256": hashlib.sha256(blob).hexdigest(), "versions": {}}
    (stash / "bundle.json").write_text(json.dumps(doc))
    return stash


def _install(stash: Path, target: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(INSTALL), str(stash), str(target)], capture_output=True, text=True)


def test_all_pieces_with_the_digest_unpack_into_the_target(tmp_path: Path) -> None:
    done = _install(_stash(tmp_path), tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "torch" / "__init__.py").read_text().startswith("__version__")


def test_a_missing_piece_or_a_wrong_digest_stops_the_install(tmp_path: Path) -> None:
    stash = _stash(tmp_path)
    (stash / "site.tar.xz.01").rename(tmp_path / "aside")
    done = _install(stash, tmp_path / "site")
    assert done.returncode == 1 and "1 of 2 pieces" in done.stderr
    (tmp_path / "aside").write_bytes(b"cut short")
    (tmp_path / "aside").rename(stash / "site.tar.xz.01")
    done = _install(stash, tmp_path / "site")
    assert done.returncode == 1 and "stash the chunks again" in done.stderr
    assert not (tmp_path / "site").exists()


def test_the_check_refuses_a_torch_that_is_not_the_bundles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    for name, version, where in (
        ("torch", "2.11.0+cu130", tmp_path / "venv" / "torch" / "__init__.py"),
        ("triton", "3.7.1", site / "triton" / "__init__.py"),
        ("vllm", "0.32.0", site / "vllm" / "__init__.py"),
    ):
        module = types.ModuleType(name)
        module.__version__ = version  # type: ignore[attr-defined]
        module.__file__ = str(where)
        monkeypatch.setitem(sys.modules, name, module)
    failures: list[str] = []
    doc: dict[str, object] = {}
    gpu_bundle_check._versions({"torch": "2.13.0", "triton": "3.7.1", "vllm": "0.32.0"}, site, doc, failures)
    assert failures == [
        "torch 2.11.0+cu130 imported, the bundle holds 2.13.0",
        f"torch imported from {tmp_path}/venv/torch/__init__.py, not from the bundle at {site}",
    ]
