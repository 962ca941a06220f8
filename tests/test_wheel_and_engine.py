"""The self-built wheel and the torch engine's host-side parts."""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from kernelbake import __version__
from kernelbake._wheel import build_wheel
from kernelbake.contract.key import Engine
from kernelbake.plan import plan
from kernelbake.render import target_config
from kernelbake.runtime.engines import get_engine
from kernelbake.runtime.engines.torch_engine import TorchEngine
from kernelbake.spec import load_spec
from tests.conftest import REPO


def test_wheel_is_reproducible_and_complete(tmp_path: Path) -> None:
    a = build_wheel(tmp_path / "a")
    b = build_wheel(tmp_path / "b")
    assert a.name == f"kernelbake-{__version__}-py3-none-any.whl"
    assert a.read_bytes() == b.read_bytes()
    with zipfile.ZipFile(a) as zf:
        names = set(zf.namelist())
        assert {
            "kernelbake/cli/__init__.py",
            "kernelbake/data/gpus.yaml",
            "kernelbake/_templates/Dockerfile.j2",
        } <= names
        assert not any("__pycache__" in n for n in names)
        info = f"kernelbake-{__version__}.dist-info"
        assert "kernelbake = kernelbake.cli:main" in zf.read(f"{info}/entry_points.txt").decode()
        for line in zf.read(f"{info}/RECORD").decode().splitlines():
            name, digest, size = line.split(",")
            if name.endswith("RECORD"):
                continue
            data = zf.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={expected}" and int(size) == len(data)


def test_the_wheel_declares_what_pyproject_declares_and_vllm_finds_the_plugin(tmp_path: Path) -> None:
    """Installed into a fresh venv, the wheel answers ``importlib.metadata`` as the project says:
    vLLM's workers at TP > 1 find the compile-only plugin only through this entry point group."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wheel = build_wheel(tmp_path / "wheel")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)], check=True
    )
    probe = """
import json, importlib.metadata as m
d = m.distribution("kernelbake")
print(json.dumps({
    "plugins": {e.name: e.value for e in m.entry_points(group="vllm.general_plugins")},
    "scripts": {e.name: e.value for e in m.entry_points(group="console_scripts") if e.dist.name == "kernelbake"},
    "requires": d.requires, "python": d.metadata["Requires-Python"], "version": d.version,
}))
from kernelbake._wheel import metadata_from_installed
print(metadata_from_installed().entry_points_txt())
"""
    # -I: nothing from this test's environment (PYTHONPATH, the repo) leaks into the answer.
    done = subprocess.run([str(python), "-I", "-c", probe], check=True, capture_output=True, text=True)
    first, _, entry_points_txt = done.stdout.partition("\n")
    found = json.loads(first)
    assert found["plugins"] == project["entry-points"]["vllm.general_plugins"]
    assert found["plugins"] == {"kernelbake": "kernelbake.runtime.engines.vllm.plugin:register"}
    assert found["scripts"] == project["scripts"]
    assert found["requires"] == project["dependencies"]
    assert found["python"] == project["requires-python"]
    assert found["version"] == __version__
    assert (venv / "bin" / "kernelbake").is_file()
    module, _, attr = found["plugins"]["kernelbake"].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
    # Built from an installed kernelbake (no pyproject.toml), the wheel would say the same.
    with zipfile.ZipFile(wheel) as zf:
        written = zf.read(f"kernelbake-{__version__}.dist-info/entry_points.txt").decode()
    assert entry_points_txt.rstrip("\n") == written.rstrip("\n")


def test_torch_engine_host_side() -> None:
    engine = get_engine(Engine.TORCH)
    assert isinstance(engine, TorchEngine)
    env = engine.declaration.cache_env(Path("/opt/kernelbake/cache"))
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/opt/kernelbake/cache/inductor"
    assert env["TRITON_CACHE_DIR"] == "/opt/kernelbake/cache/triton"
    assert env["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] == "0"
    assert set(engine.hashed_env_names()) >= {"TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"}
    (t,) = plan(load_spec(REPO / "images" / "tiny-llama-torch.yaml"), ["cpu"])
    assert engine.shape_args(target_config(t), ["--port", "9000", "--shapes=2x64", "--warmup-only"]) == [
        "--shapes 2x64 are not among the baked shapes (Dynamo decides whether they compile)"
    ]
    argv = engine.serve_argv(target_config(t), ["--port", "9000"])
    assert argv[1:] == ["-m", "kernelbake.runtime.engines.torch_serve", "--port", "9000"]


@pytest.mark.parametrize(
    ("text", "driver"),
    [
        # An H200 host with the open kernel module (read on a real machine).
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n",
            "580.159.04",
        ),
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n",
            "535.104.05",
        ),
        ("garbage\n", "none"),
    ],
)
def test_nvidia_driver_version(
    text: str, driver: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernelbake.runtime import probe

    version = tmp_path / "version"
    version.write_text(text)
    monkeypatch.setattr(probe, "_NVIDIA_VERSION", version)
    assert probe.nvidia_driver() == driver
