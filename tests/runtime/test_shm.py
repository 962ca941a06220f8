"""``serve`` checks ``/dev/shm`` against what the engine needs before it starts anything: a
container with Docker's 64 MiB fails in its first second with the flag to add, instead of
vLLM dying tens of seconds in after the caches were said to be valid."""

from __future__ import annotations

import dataclasses
import os
import textwrap
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.contract.serve import ServeArgs
from kernelbake.errors import EnvironmentProblem
from kernelbake.plan import plan
from kernelbake.render import target_config
from kernelbake.runtime import shm
from kernelbake.runtime.engines.vllm import shm as vshm
from kernelbake.runtime.shm import MIB, ShmNeed
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.support.fake_engine import FakeEngine, platform_for

# The shape of vLLM 0.32's own files, cut to what is read (different numbers, to see that
# they are read rather than assumed).
ENVS = """\
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    VLLM_HOST_IP: str = ""
    VLLM_MQ_MAX_CHUNK_BYTES_MB: int = 8
"""
SHM_BROADCAST = """\
class MessageQueue:
    def __init__(
        self,
        n_reader,
        n_local_reader,
        local_reader_ranks: list[int] | None = None,
        max_chunk_bytes: int = 1024 * 1024 * 4,
        max_chunks: int = 5,
        connect_ip: str | None = None,
    ):
        pass
"""
SERVE = ServeArgs()


def fake_vllm(tmp_path: Path, envs: str = ENVS, broadcast: str = SHM_BROADCAST) -> Path:
    root = tmp_path / "vllm"
    (root / vshm.SHM_BROADCAST).parent.mkdir(parents=True)
    (root / vshm.ENVS).write_text(envs)
    (root / vshm.SHM_BROADCAST).write_text(textwrap.dedent(broadcast))
    return root


def test_the_need_is_read_from_the_installed_vllm_source(tmp_path: Path) -> None:
    need = vshm.shm_need(SERVE, [], {}, cpu_build=True, root=fake_vllm(tmp_path))
    assert need is not None
    # broadcast: (8 MiB + 1 + 1 reader) x 5 chunks; one worker's responses: (4 MiB + 2) x 5.
    assert need.bytes == (8 * MIB + 2) * 5 + (4 * MIB + 2) * 5
    assert "40 MiB to its workers + 1 x 20 MiB of worker responses" in need.what
    assert need.source == "read from the installed vLLM's source"


def test_workers_and_the_chunk_variable_scale_the_need(tmp_path: Path) -> None:
    root = fake_vllm(tmp_path)
    need = vshm.shm_need(
        SERVE,
        ["-tp", "2", "--pipeline-parallel-size=2"],
        {"VLLM_MQ_MAX_CHUNK_BYTES_MB": "1"},
        cpu_build=False,
        root=root,
    )
    assert need is not None
    assert need.bytes == (1 * MIB + 1 + 4) * 5 + 4 * (4 * MIB + 2) * 5
    assert "VLLM_MQ_MAX_CHUNK_BYTES_MB=1" in need.source


def test_a_single_gpu_worker_or_an_explicit_uni_executor_needs_none(tmp_path: Path) -> None:
    root = fake_vllm(tmp_path)
    assert vshm.shm_need(SERVE, [], {}, cpu_build=False, root=root) is None
    assert (
        vshm.shm_need(SERVE, [], {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, cpu_build=True, root=root) is None
    )
    assert (
        vshm.shm_need(SERVE, ["--distributed-executor-backend", "ray"], {}, cpu_build=True, root=root) is None
    )


def test_unreadable_source_falls_back_to_the_documented_defaults_and_says_so(tmp_path: Path) -> None:
    root = fake_vllm(
        tmp_path,
        broadcast="class MessageQueue:\n    def __init__(self, n, max_chunk_bytes=size()):\n        pass\n",
    )
    need = vshm.shm_need(SERVE, [], {}, cpu_build=True, root=root)
    assert need is not None
    assert need.bytes == (16 * MIB + 2) * 10 + (24 * MIB + 2) * 10
    assert need.source.startswith("vLLM 0.26's and 0.32's defaults; the installed vLLM could not be read")
    assert vshm.shm_need(SERVE, [], {}, cpu_build=True, root=None) == dataclasses.replace(
        need,
        source="vLLM 0.26's and 0.32's defaults; the installed vLLM could not be read: vllm is not installed",
    )


def test_too_little_free_space_is_an_environment_problem_naming_the_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    need = ShmNeed(engine="vLLM", bytes=400 * MIB + 40, what="its queues", source="read")
    monkeypatch.setattr(shm, "free_bytes", lambda _path: 64 * MIB)
    with pytest.raises(EnvironmentProblem) as exc:
        shm.require(need)
    assert exc.value.return_code == 3
    # main() prefixes "kernelbake serve: error: "; the flag is the docs' 2g (README, serve.yaml's
    # sizeLimit), so the message and the pages agree.
    assert str(exc.value) == (
        "/dev/shm has 64 MiB free; vLLM needs >= 401 MiB for its queues (read): add "
        "`--shm-size=2g` (docker/podman) or `--ipc=host`, or an emptyDir with medium: Memory at "
        "/dev/shm (Kubernetes)"
    )
    assert ShmNeed(engine="vLLM", bytes=5 * 1024 * MIB, what="q", source="r").flag() == "--shm-size=5g"
    monkeypatch.setattr(shm, "free_bytes", lambda _path: 401 * MIB)
    shm.require(need)
    shm.require(None)


def test_free_space_is_the_filesystems_own(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    free = shm.free_bytes(tmp_path)
    assert free is not None and abs(free - st.f_bavail * st.f_frsize) < 64 * MIB
    assert shm.free_bytes(tmp_path / "absent") is None


def test_serve_fails_before_the_preflight_and_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (t,) = plan(load_spec(REPO / "images" / "tiny-llama-torch.yaml"), ["cpu"])
    config = dataclasses.replace(target_config(t), cache_root=str(tmp_path / "cache"))
    (tmp_path / "target.json").write_text(config.to_json())
    monkeypatch.setenv("KERNELBAKE_UNSAFE_TARGET", str(tmp_path / "target.json"))
    engine = FakeEngine(platform_for(config.key))
    engine.shm = ShmNeed(engine="vLLM", bytes=1 << 62, what="its queues", source="read")
    monkeypatch.setattr("kernelbake.runtime.engines.get_engine", lambda _engine: engine)

    def no_preflight(*_args: object, **_kw: object) -> None:
        raise AssertionError("the preflight ran")

    monkeypatch.setattr("kernelbake.runtime.serve.preflight.speculate", no_preflight)
    monkeypatch.setattr("kernelbake.runtime.serve.preflight.preflight", no_preflight)
    assert main(["serve"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("kernelbake serve: error: /dev/shm has") and err.count("serve:") == 1, err
    assert "add `--shm-size=" in err and "--ipc=host" in err
