"""The self-built wheel and the torch engine's host-side parts."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from kernelbake import __version__
from kernelbake._wheel import build_wheel
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


def test_torch_engine_host_side() -> None:
    engine = get_engine(TorchEngine.engine)
    assert isinstance(engine, TorchEngine)
    env = engine.cache_env(Path("/opt/kernelbake/cache"))
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/opt/kernelbake/cache/inductor"
    assert env["TRITON_CACHE_DIR"] == "/opt/kernelbake/cache/triton"
    assert env["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] == "0"
    assert set(engine.hashed_env_names()) >= {"TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"}
    (t,) = plan(load_spec(REPO / "images" / "tiny-llama-torch.yaml"), ["cpu"])
    assert engine.shape_args(target_config(t), ["--port", "9000", "--shapes=2x64", "--warmup-only"]) == [
        "--shapes=2x64 changes the warmed-up input shapes"
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


def test_gpu_arch_uses_the_catalogue() -> None:
    from kernelbake.runtime import probe

    assert probe.gpu_arch("NVIDIA H200", (9, 0)) == "sm_90a"
    assert probe.gpu_arch("NVIDIA Unknown", (8, 6)) == "sm_86"
