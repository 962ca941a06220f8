"""What ``snapshot take`` refuses before and while it dumps (secrets, io_urings, clients), read
from a fake /proc; and the seccomp filter that keeps io_uring out of the tree, on the real kernel."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from kernelbake.errors import BadInput, EnvironmentProblem
from kernelbake.runtime import nvml
from kernelbake.runtime.env import SNAPSHOT_TAKE_ENV
from kernelbake.runtime.snapshot import io_uring, take, tree
from kernelbake.runtime.snapshot.driver import DeviceMemory, rise
from kernelbake.runtime.snapshot.take import Options, refuse_secrets
from tests.runtime.snapshot.fakes import FakeCriu, FakeDriver
from tests.support.runtime_target import runtime_env, write_target

_RING = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 8, params)
print(fd, ctypes.get_errno() if fd < 0 else 0)
"""


def test_the_filter_makes_io_uring_setup_fail_with_enosys() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _RING], preexec_fn=io_uring.deny, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["-1", "38"]


def test_without_the_filter_the_call_is_not_enosys() -> None:
    # What the filter changes: a ring, or this machine's own refusal (EPERM under a container's
    # default seccomp profile), never ENOSYS.
    out = subprocess.run([sys.executable, "-c", _RING], capture_output=True, text=True, check=True)
    assert out.stdout.split() != ["-1", "38"]


def test_a_secret_is_refused_by_name_never_by_value() -> None:
    with pytest.raises(BadInput) as info:
        refuse_secrets({"HF_TOKEN": "hf_abcdefgh", "PATH": "/bin"}, ["--api-key", "sk-12345678"], "take")
    message = str(info.value)
    assert "$HF_TOKEN" in message and "--api-key" in message
    assert "hf_abcdefgh" not in message and "sk-12345678" not in message
    refuse_secrets(
        {"PATH": "/bin", "VLLM_LONG_PREFILL_TOKEN_THRESHOLD": "8"}, ["--max-num-seqs", "8"], "take"
    )


def test_take_refuses_before_it_starts_anything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_target(tmp_path, "tiny-llama.yaml")
    started: list[object] = []
    monkeypatch.setattr(take, "spawn", lambda *a, **k: started.append(a))
    env = runtime_env(tmp_path, VLLM_API_KEY="secret-value")
    with pytest.raises(BadInput, match=r"\$VLLM_API_KEY would be frozen"):
        take.take(
            env, tmp_path / "out", Options(image="sha256:" + "1" * 64), driver=FakeDriver(), criu=FakeCriu(1)
        )  # type: ignore[arg-type]
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy/x").write_text("")
    with pytest.raises(BadInput, match="not an empty directory"):
        take.take(
            runtime_env(tmp_path),
            tmp_path / "busy",
            Options(image="sha256:" + "1" * 64),
            driver=FakeDriver(),
            criu=FakeCriu(1),
        )  # type: ignore[arg-type]
    assert started == []


def _proc(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    for pid, ppid, comm in (
        (10, 1, "python3"),
        (11, 10, "VLLM::EngineCore"),
        (12, 11, "w (x)"),
        (20, 1, "other"),
    ):
        d = proc / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0")
        (d / "cmdline").write_bytes(b"\0".join([comm.encode(), b"--port", b"8000"]) + b"\0")
        (d / "environ").write_bytes(b"PATH=/bin\0")
    (proc / "11/fd/7").symlink_to("anon_inode:[io_uring]")
    (proc / "10/fd/3").symlink_to("socket:[555]")
    (proc / "10/fd/4").symlink_to("socket:[556]")
    (proc / "10/net").mkdir()
    header = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    )
    rows = [
        "   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 555",
        "   1: 0100007F:1F40 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 556",
        "   2: 0100007F:1F40 0100007F:D432 01 00000000:00000000 00:00000000 00000000     0        0 999",
    ]
    (proc / "10/net/tcp").write_text(header + "\n".join(rows) + "\n")
    return proc


def test_the_tree_and_what_it_holds_are_read_from_proc(tmp_path: Path) -> None:
    proc = _proc(tmp_path)
    assert tree.descendants(10, proc) == [10, 11, 12]
    assert tree.io_urings(11, proc) == ["7"] and tree.io_urings(10, proc) == []
    # One connection accepted on 8000 by the tree (inode 556); 999 is not the tree's; 555 listens.
    assert tree.clients([10, 11, 12], 8000, proc) == 1
    assert tree.secrets(10, proc) == []
    (proc / "12/environ").write_bytes(b"PATH=/bin\0HF_TOKEN=hf_x\0")
    (proc / "12/cmdline").write_bytes(b"vllm\0--api-key=abc\0")
    assert tree.secrets(12, proc) == ["$HF_TOKEN", "argv --api-key"]
    # GPU device files, open or mapped (CRIU cannot dump them).
    assert tree.gpu_files(10, proc) == []
    (proc / "10/fd/5").symlink_to("/dev/nvidiactl")
    (proc / "12/maps").write_text(
        "7f0000000000-7f0000001000 rw-s 00000000 00:05 1031 /dev/nvidia-uvm\n"
        "7f0000002000-7f0000003000 rw-s 00000000 00:05 1032 /dev/nvidia0\n"
        "7f0000004000-7f0000005000 rw-s 00000000 00:05 1032 /dev/nvidia0\n"
        "7f0000006000-7f0000007000 r-xp 00000000 08:01 2048 /usr/lib/libc.so.6\n"
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0    [stack]\n"
        "7ffd00030000-7ffd00031000 rw-p 00000000 00:00 0\n"
    )
    assert tree.gpu_files(10, proc) == ["/dev/nvidiactl"]
    assert tree.gpu_files(12, proc) == ["/dev/nvidia-uvm", "/dev/nvidia0"]
    assert tree.gpu_files(99, proc) == []  # gone meanwhile


def _dump_refused(tmp_path: Path, driver: FakeDriver) -> str:
    """take's dump of the tree 10 → 11, 12, refused before CRIU runs: why."""
    with pytest.raises(EnvironmentProblem) as err:
        take._dump(
            runtime_env(tmp_path), type("P", (), {"pid": 10})(), [10, 11, 12], tmp_path / "out",
            driver=driver, criu=FakeCriu(0),
        )  # fmt: skip
    return str(err.value)


def test_a_process_still_holding_the_gpu_after_the_checkpoint_stops_take_before_criu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that opened the GPU without a CUDA context (a device query) keeps its device
    files through the driver's checkpoint, and CRIU cannot dump them: take names it, gives the
    device state back and never runs the dump."""
    held = {11: ["/dev/nvidia0", "/dev/nvidiactl"]}
    monkeypatch.setattr(tree, "gpu_files", lambda pid, proc=tree.PROC: held.get(pid, []))
    monkeypatch.setattr(tree, "cmdline", lambda pid, proc=tree.PROC: ["kernelbake", "serve"])
    driver = FakeDriver()
    assert _dump_refused(tmp_path, driver).startswith(
        "pid 11 (kernelbake serve) still holds /dev/nvidia0, /dev/nvidiactl after the driver's checkpoint; "
        "CRIU cannot dump a GPU device file, and it has no kernelbake handler to shut NVML down"
    )
    # Only the process holding the GPU had device state to move, and it is given back.
    assert driver.checkpointed == [11] and driver.restored == [11]
    assert not (tmp_path / "out").exists()


class _DumpingCriu(FakeCriu):
    def __init__(self) -> None:
        super().__init__(0)
        self.dumped: list[int] = []

    def dump(self, pid: int, images: Path, work: Path) -> tuple[bool, str]:
        self.dumped.append(pid)
        return True, str(work / "dump.log")


@pytest.mark.parametrize("closes", [True, False])
def test_a_process_holding_nvmls_files_is_asked_to_shut_it_down_and_dumped_once_they_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closes: bool
) -> None:
    """Device files that outlive the driver's checkpoint (vLLM 0.32's forked engine core on the
    H100 held NVML's, inherited from the API server): take sends the process that catches
    nvml.RELEASE_SIGNAL that signal, waits for the files to close and dumps; one that does not
    close them in time is named, the dump never runs."""
    held = {11: ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia0", "/dev/nvidiactl"]}
    monkeypatch.setattr(tree, "gpu_files", lambda pid, proc=tree.PROC: held.get(pid, []))
    monkeypatch.setattr(tree, "cmdline", lambda pid, proc=tree.PROC: ["VLLM::EngineCore"])
    monkeypatch.setattr(
        tree, "catches", lambda pid, signum, proc=tree.PROC: pid == 11 and signum == nvml.RELEASE_SIGNAL
    )
    monkeypatch.setattr(take, "NVML_RELEASE_S", 0.3)
    sent: list[tuple[int, int]] = []

    def kill(pid: int, signum: int) -> None:
        sent.append((pid, signum))
        if closes:
            held.pop(pid)

    monkeypatch.setattr(take, "_release_nvml", functools.partial(take._release_nvml, kill=kill))
    driver, criu = FakeDriver(), _DumpingCriu()
    if closes:
        taken, gpu_pids = take._dump(
            runtime_env(tmp_path), type("P", (), {"pid": 10})(), [10, 11, 12], tmp_path / "out",
            driver=driver, criu=criu,
        )  # fmt: skip
        assert gpu_pids == [11] and criu.dumped == [10] and driver.restored == []
        assert "nvml_release_s" in taken
    else:
        with pytest.raises(EnvironmentProblem) as err:
            take._dump(
                runtime_env(tmp_path), type("P", (), {"pid": 10})(), [10, 11, 12], tmp_path / "out",
                driver=driver, criu=criu,
            )  # fmt: skip
        assert "pid 11 (VLLM::EngineCore) still holds /dev/nvidia-caps/nvidia-cap1" in str(err.value)
        assert "it was asked to shut NVML down and still held them 0.3 s later" in str(err.value)
        # What the H100 showed (vLLM 0.32, forked engine core): named as a cause, with its remedy.
        assert "inherited the files through a fork keeps them" in str(err.value)
        assert "started by spawn or exec" in str(err.value)
        assert criu.dumped == [] and driver.restored == [11]
    # Only the process holding files after the checkpoint was signalled, once.
    assert sent == [(11, nvml.RELEASE_SIGNAL)]


def test_the_driver_checkpoints_only_processes_holding_the_gpu_and_a_refusal_names_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve, the tree's root, holds no CUDA context, and the driver refuses such a process
    (CUresult 3, seen on the H100): take checkpoints the processes holding the GPU. One the
    driver refuses is named, and those already checkpointed get their state back."""
    held = {11: ["/dev/nvidia0"], 12: ["/dev/nvidia0", "/dev/nvidiactl"]}
    monkeypatch.setattr(tree, "gpu_files", lambda pid, proc=tree.PROC: held.get(pid, []))
    monkeypatch.setattr(tree, "cmdline", lambda pid, proc=tree.PROC: ["python3", f"worker-{pid}"])

    class Refusing(FakeDriver):
        def checkpoint(self, pid: int) -> None:
            if pid == 12:
                raise EnvironmentProblem("the driver's cuCheckpointProcessLock failed with CUresult 3")
            super().checkpoint(pid)

    driver = Refusing()
    assert _dump_refused(tmp_path, driver).startswith(
        "pid 12 (python3 worker-12) holds the GPU, but the driver could not checkpoint it: "
        "the driver's cuCheckpointProcessLock failed with CUresult 3."
    )
    assert driver.checkpointed == [11] and driver.restored == [11]
    assert not (tmp_path / "out").exists()


def test_weights_outside_needs_sleep_mode_dev_endpoints_and_their_guard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernelbake.contract.snapshot import Weights
    from kernelbake.runtime.snapshot.devguard import MIDDLEWARE

    write_target(tmp_path, "tiny-llama.yaml")
    started: list[object] = []
    monkeypatch.setattr(take, "spawn", lambda *a, **k: started.append(a))
    options = Options(image="sha256:" + "1" * 64, weights=Weights.OUTSIDE, user_args=("--seed", "0"))
    with pytest.raises(BadInput) as info:
        take.take(runtime_env(tmp_path), tmp_path / "out", options, driver=FakeDriver(), criu=FakeCriu(1))  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith(
        "kernelbake snapshot take --weights outside: the engine runs without --enable-sleep-mode"
    )
    assert "VLLM_SERVER_DEV_MODE=1 is unset" in message and f"--middleware {MIDDLEWARE} is missing" in message
    assert started == []
    from kernelbake.contract.target import TargetConfig

    target = TargetConfig.load(tmp_path / "target.json")
    ok = ("--enable-sleep-mode", f"--middleware={MIDDLEWARE}")
    assert take.weights_out_problems(target, {"VLLM_SERVER_DEV_MODE": "1"}, ok) == []
    assert (
        take.weights_out_problems(
            target, {"VLLM_SERVER_DEV_MODE": "1"}, ("--enable-sleep-mode", "--middleware", MIDDLEWARE)
        )
        == []
    )


def test_the_dev_guard_lets_only_loopback_past_the_serving_api() -> None:
    from kernelbake.runtime.snapshot.devguard import allowed

    for path in ("/v1/completions", "/health", "/metrics", "/v1"):
        assert allowed(path, "10.1.2.3"), path
    for path in (
        "/collective_rpc",
        "/sleep",
        "/wake_up",
        "/is_sleeping",
        "/reset_prefix_cache",
        "/v1x",
        "/healthz",
    ):
        assert not allowed(path, "10.1.2.3"), path
        assert not allowed(path, None), path
        assert not allowed(path, "not an address"), path
        assert allowed(path, "127.0.0.1") and allowed(path, "::1"), path


def test_the_dev_guard_answers_403_without_calling_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import types

    from kernelbake.runtime.snapshot import devguard

    monkeypatch.setattr(devguard, "_refuse", lambda path: ("403", path))
    reached: list[str] = []

    async def app(request: object) -> str:
        reached.append("app")
        return "200"

    def request(host: str | None, path: str) -> object:
        client = types.SimpleNamespace(host=host) if host else None
        return types.SimpleNamespace(client=client, url=types.SimpleNamespace(path=path))

    assert asyncio.run(devguard.loopback_only(request("10.0.0.9", "/collective_rpc"), app)) == (
        "403",
        "/collective_rpc",
    )
    assert asyncio.run(devguard.loopback_only(request(None, "/sleep"), app)) == ("403", "/sleep")
    assert reached == []
    assert asyncio.run(devguard.loopback_only(request("127.0.0.1", "/collective_rpc"), app)) == "200"
    assert reached == ["app"]


def test_the_dev_guard_holds_health_at_503_while_the_weights_are_reloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restored engine whose weights were left out answers /health before they are back: a
    readiness probe must not see it ready until serve removes the mark."""
    import asyncio
    import types

    from kernelbake.runtime.snapshot import devguard

    mark = tmp_path / "reloading"
    monkeypatch.setattr(devguard, "_RELOADING", mark)
    monkeypatch.setattr(devguard, "_reloading", lambda: "503")

    async def app(request: object) -> str:
        return "200"

    def request(path: str) -> object:
        return types.SimpleNamespace(
            client=types.SimpleNamespace(host="10.0.0.9"), url=types.SimpleNamespace(path=path)
        )

    mark.write_text("")
    assert asyncio.run(devguard.loopback_only(request("/health"), app)) == "503"
    # Only /health: the API a client already reached, and serve's own calls, go on.
    assert asyncio.run(devguard.loopback_only(request("/v1/completions"), app)) == "200"
    mark.unlink()
    assert asyncio.run(devguard.loopback_only(request("/health"), app)) == "200"


class _Engine:
    """vLLM's development endpoints as take meets them: each answer given, each path asked kept."""

    def __init__(self, *, reload: int = 200, sleeping: str = "true") -> None:
        import http.server
        import threading

        asked: list[str] = []
        bodies: list[bytes] = []
        self.asked, self.bodies = asked, bodies

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                asked.append(self.path)
                bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(reload if self.path == "/collective_rpc" else 200)
                self.end_headers()

            def do_GET(self) -> None:
                asked.append(self.path)
                body = f'{{"is_sleeping": {sleeping}}}'.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(("sleeping", "ok"), [("true", True), ("false", False)])
def test_sleep_is_asked_for_and_then_checked(sleeping: str, ok: bool) -> None:
    from kernelbake.errors import EnvironmentProblem

    engine = _Engine(sleeping=sleeping)
    try:
        if ok:
            take._sleep(engine.base)
        else:
            with pytest.raises(EnvironmentProblem, match="does not say the engine sleeps"):
                take._sleep(engine.base)
    finally:
        engine.stop()
    assert engine.asked == ["/sleep?level=2", "/is_sleeping"]


@pytest.mark.parametrize("answer", [200, 500])
def test_the_reload_every_restore_needs_is_asked_once_before_the_snapshot(answer: int) -> None:
    """vLLM 0.32 answers 500 to reload_weights under --load-format dummy or sharded_state: such
    a snapshot would fail at every restore, so take stops before the dump, saying why."""
    from kernelbake.errors import EnvironmentProblem
    from kernelbake.runtime.snapshot import http

    engine = _Engine(reload=answer)
    try:
        if answer == 200:
            take._reload_once(engine.base)
        else:
            with pytest.raises(
                EnvironmentProblem, match="reload_weights answered 500: this engine cannot reload"
            ):
                take._reload_once(engine.base)
    finally:
        engine.stop()
    assert engine.asked == ["/collective_rpc"]
    assert json.loads(engine.bodies[0]) == {"method": "reload_weights", "kwargs": {}, "timeout": 600}
    assert http.RELOAD_WEIGHTS == "reload_weights"


@pytest.mark.parametrize(
    ("args", "given", "port"),
    [
        ((), None, 8000),
        (("--seed", "0", "--port", "59981"), None, 59981),
        (("--port=9000", "--seed", "0"), None, 9000),
        (("--port", "9000", "--port", "9001"), None, 9001),  # the last, as argparse reads them
        (("--port", "9000"), 9000, 9000),
        ((), 8000, 8000),
    ],
)
def test_take_waits_on_the_port_the_engine_is_told(
    args: tuple[str, ...], given: int | None, port: int
) -> None:
    assert take.served_port(Options(image="sha256:" + "1" * 64, user_args=args, port=given)) == port


@pytest.mark.parametrize(
    ("args", "given", "said"),
    [
        # The H200 run of 2026-12-05: the engine on 59981, take looking at 8000 for 600 s.
        (("--port", "59981"), 8000, "--port 8000: the engine's arguments give --port 59981"),
        ((), 9000, "no --port (vLLM's default, 8000)"),
        (("--port", "http"), None, "'http' is not a port number"),
        (("--port=70000",), None, "'70000' is not a port number"),
    ],
)
def test_a_port_take_would_wait_on_in_vain_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], given: int | None, said: str
) -> None:
    write_target(tmp_path, "tiny-llama.yaml")
    spawned: list[object] = []
    monkeypatch.setattr(take, "spawn", lambda *a, **k: spawned.append(a))
    with pytest.raises(BadInput, match=said.replace("(", r"\(").replace(")", r"\)")):
        take.take(
            runtime_env(tmp_path),
            tmp_path / "out",
            Options(image="sha256:" + "1" * 64, user_args=args, port=given),
            driver=FakeDriver(),
            criu=FakeCriu(1),
        )  # type: ignore[arg-type]
    assert spawned == []


def test_take_starts_the_engine_with_the_nvml_release_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's plugin installs the release handler only where this variable is set: take sets it
    for the engine it starts, and only there (the key's environment is the container's)."""
    write_target(tmp_path, "tiny-llama.yaml")
    envs: list[Mapping[str, str]] = []

    def spawn(argv: object, *, env: Mapping[str, str], **kwargs: object) -> None:
        envs.append(env)
        raise EnvironmentProblem("stopped after the spawn")

    monkeypatch.setattr(take, "spawn", spawn)
    monkeypatch.setattr(tree, "raise_pids", lambda floor, proc=tree.PROC: None)
    env = runtime_env(tmp_path)
    with pytest.raises(EnvironmentProblem, match="stopped after the spawn"):
        take.take(
            env, tmp_path / "out", Options(image="sha256:" + "1" * 64), driver=FakeDriver(), criu=FakeCriu(1)
        )  # type: ignore[arg-type]
    assert envs[0][SNAPSHOT_TAKE_ENV] == "1" and SNAPSHOT_TAKE_ENV not in env.environ


def test_a_process_gone_before_it_is_asked_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    held = {11: ["/dev/nvidiactl"]}
    monkeypatch.setattr(tree, "gpu_files", lambda pid, proc=tree.PROC: held.get(pid, []))
    monkeypatch.setattr(tree, "catches", lambda pid, signum, proc=tree.PROC: True)
    monkeypatch.setattr(take, "NVML_RELEASE_S", 0.1)

    def gone(pid: int, signum: int) -> None:
        held.pop(pid)
        raise ProcessLookupError(pid)

    assert take._release_nvml([10, 11], kill=gone) == [11]


def test_only_the_link_remap_files_of_this_dump_are_removed_from_shm(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "link_remap.1").write_bytes(b"another dump's")
    before = take._shm_names(shm)
    for name in ("link_remap.413", "psm_0c1d", "sem.mp-x"):
        (shm / name).write_bytes(b"x")
    (shm / "link_remap.9").mkdir()
    assert take._tidy_shm(shm, before) == ["link_remap.413"]
    assert sorted(p.name for p in shm.iterdir()) == ["link_remap.1", "link_remap.9", "psm_0c1d", "sem.mp-x"]


def test_a_failed_dump_leaves_no_link_remap_file_in_shm_and_no_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CRIU links each unlinked file the tree holds (multiprocessing's semaphores) back into
    /dev/shm as ``link_remap.N``; a second take on one H100 (2026-12-06) failed on the first's.
    take removes its dump's, whether the dump went through or not."""
    write_target(tmp_path, "tiny-llama.yaml")
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "psm_queue").write_bytes(b"the tree's")
    monkeypatch.setattr(take, "SHM_DIR", str(shm))
    monkeypatch.setattr(tree, "raise_pids", lambda floor, proc=tree.PROC: None)
    started: list[subprocess.Popen[bytes]] = []

    def spawn(argv: object, **kwargs: object) -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen(["sleep", "30"]))
        return started[0]

    def dump(*args: object, **kwargs: object) -> None:
        (shm / "link_remap.413").write_bytes(b"")
        raise EnvironmentProblem("criu dump of pid 1 failed: stopped here")

    monkeypatch.setattr(take, "spawn", spawn)
    monkeypatch.setattr(take, "_warmed", lambda *a: ({}, ()))
    monkeypatch.setattr(take, "_wait_quiet", lambda *a: None)
    monkeypatch.setattr(take, "_check_tree", lambda *a: None)
    monkeypatch.setattr(take, "here_key", lambda **kw: None)
    monkeypatch.setattr(take, "_dump", dump)
    with pytest.raises(EnvironmentProblem, match="stopped here"):
        take.take(
            runtime_env(tmp_path), tmp_path / "out", Options(image="sha256:" + "1" * 64),
            driver=FakeDriver(), criu=FakeCriu(1),  # type: ignore[arg-type]
        )  # fmt: skip
    assert sorted(p.name for p in shm.iterdir()) == ["psm_queue"]
    assert started[0].poll() is not None


def test_weights_beside_also_need_the_worker_extension(tmp_path: Path) -> None:
    from kernelbake.contract.snapshot import WEIGHTS_EXTENSION, Weights
    from kernelbake.contract.target import TargetConfig
    from kernelbake.runtime.snapshot.devguard import MIDDLEWARE

    write_target(tmp_path, "tiny-llama.yaml")
    target = TargetConfig.load(tmp_path / "target.json")
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    asleep = ("--enable-sleep-mode", "--middleware", MIDDLEWARE)
    assert take.weights_out_problems(target, env, asleep, Weights.OUTSIDE) == []
    (missing,) = take.weights_out_problems(target, env, asleep, Weights.BESIDE)
    assert missing.startswith(f"--worker-extension-cls {WEIGHTS_EXTENSION} is missing")
    extended = (*asleep, f"--worker-extension-cls={WEIGHTS_EXTENSION}")
    assert take.weights_out_problems(target, env, extended, Weights.BESIDE) == []
    # Another extension in its place is not this one.
    other = (*asleep, "--worker-extension-cls", "my.Extension")
    assert len(take.weights_out_problems(target, env, other, Weights.BESIDE)) == 1


@pytest.mark.parametrize("answer", [200, 500])
def test_weights_beside_are_saved_and_copied_back_once_before_the_snapshot(
    tmp_path: Path, answer: int
) -> None:
    """The copy every restore makes is made once at take, awake: an engine that cannot is
    not snapshotted."""
    from kernelbake.contract.snapshot import LOAD_WEIGHTS, SAVE_WEIGHTS
    from kernelbake.errors import EnvironmentProblem

    engine = _Engine(reload=answer)
    folder = tmp_path / "out/images/weights"
    try:
        if answer == 200:
            done = take._save_weights(engine.base, folder)
            assert set(done) == {"save_weights_s", "copy_weights_s"}
        else:
            with pytest.raises(EnvironmentProblem, match=f"{SAVE_WEIGHTS} answered 500"):
                take._save_weights(engine.base, folder)
    finally:
        engine.stop()
    asked = [json.loads(b) for b in engine.bodies]
    methods = [SAVE_WEIGHTS, LOAD_WEIGHTS] if answer == 200 else [SAVE_WEIGHTS]
    assert [a["method"] for a in asked] == methods
    assert all(a["kwargs"] == {"path": str(folder)} for a in asked)


def test_takes_lines_say_how_the_weights_beside_were_saved_and_copied_back(tmp_path: Path) -> None:
    import dataclasses

    from kernelbake.contract.snapshot import SNAPSHOT_MANIFEST, SnapshotManifest, Weights
    from tests.runtime.snapshot.fakes import FakeCriu, FakeDriver
    from tests.runtime.snapshot.test_gate import _snapshot

    write_target(tmp_path, "tiny-llama.yaml")
    _snapshot(tmp_path, 8000, driver=FakeDriver(), criu=FakeCriu(8000), weights=Weights.BESIDE)
    manifest = SnapshotManifest.from_json(
        (tmp_path / "snapshot" / SNAPSHOT_MANIFEST).read_bytes(), source="t"
    )
    lines = take.Taken(out=tmp_path, manifest=manifest).lines()
    assert len(lines) == 2 and "weights beside" not in "\n".join(lines)
    taken = {"save_weights_s": 11.1234, "copy_weights_s": 2.4, "weights_bytes": 31310479360.0}
    beside = take.Taken(out=tmp_path, manifest=dataclasses.replace(manifest, taken=taken)).lines()
    assert beside[2] == (
        "weights beside: 31310479360 B saved in 11.12 s, copied back once in 2.40 s "
        "(every restore copies them so)"
    )
    held = take.Taken(out=tmp_path, manifest=dataclasses.replace(manifest, device_bytes=71940702208)).lines()
    assert held[2] == (
        "the engine held 71940702208 B of GPU memory awake: a restore needs that much free, "
        "or serve starts the baked way"
    )


def test_a_failed_take_leaves_no_copy_of_the_weights_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernelbake.contract.snapshot import WEIGHTS_COPY

    write_target(tmp_path, "tiny-llama.yaml")
    monkeypatch.setattr(take, "SHM_DIR", str(tmp_path / "shm"))
    monkeypatch.setattr(tree, "raise_pids", lambda floor, proc=tree.PROC: None)
    started: list[subprocess.Popen[bytes]] = []

    def spawn(argv: object, **kwargs: object) -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen(["sleep", "30"]))
        return started[0]

    monkeypatch.setattr(take, "spawn", spawn)
    out = tmp_path / "out"

    def warmed(*args: object) -> tuple[dict[str, float], tuple[DeviceMemory, ...]]:
        # What the worker extension wrote before the failure.
        (out / WEIGHTS_COPY / "rank-0").mkdir(parents=True)
        (out / WEIGHTS_COPY / "rank-0" / "part-0000.bin").write_bytes(b"w" * 100)
        raise EnvironmentProblem("the engine's weights cannot be kept beside this snapshot")

    monkeypatch.setattr(take, "_warmed", warmed)
    with pytest.raises(EnvironmentProblem, match="cannot be kept beside"):
        take.take(
            runtime_env(tmp_path), out, Options(image="sha256:" + "1" * 64),
            driver=FakeDriver(), criu=FakeCriu(1),  # type: ignore[arg-type]
        )  # fmt: skip
    assert not (out / WEIGHTS_COPY).exists() and (out / "images").is_dir()
    assert started[0].poll() is not None


def _gpu(index: int, used: int, total: int = 80 << 30) -> DeviceMemory:
    return DeviceMemory(index=index, total=total, free=total - used, used=used)


def test_the_device_memory_the_engine_held_awake_is_recorded_for_the_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML's used memory before the engine starts and once it is warmed up (before any sleep):
    the largest rise of any GPU is what a restore needs free (``device_bytes``)."""
    from kernelbake.contract.snapshot import SNAPSHOT_MANIFEST, SnapshotManifest

    write_target(tmp_path, "tiny-llama.yaml")
    monkeypatch.setattr(take, "SHM_DIR", str(tmp_path / "shm"))
    monkeypatch.setattr(take, "ENGINE_LOG", str(tmp_path / "engine.log"))
    monkeypatch.setattr(tree, "raise_pids", lambda floor, proc=tree.PROC: None)
    out = tmp_path / "out"

    def spawn(argv: object, **kwargs: object) -> subprocess.Popen[bytes]:
        (tmp_path / "engine.log").write_text("ready\n")
        return subprocess.Popen(["sleep", "30"])

    def dump(
        env: object, proc: subprocess.Popen[bytes], *args: object, **kw: object
    ) -> tuple[dict[str, float], list[int]]:
        (out / "images").mkdir(parents=True)
        (out / "images" / "pages-1.img").write_bytes(b"p" * 10)
        proc.kill()
        return {"dump_s": 0.1}, []

    driver = FakeDriver()
    # Before the engine: the driver's own reservation on each GPU.
    driver.memories = [(_gpu(0, 500 << 20), _gpu(1, 600 << 20))]
    awake = (_gpu(0, 70 << 30), _gpu(1, (600 << 20) + (1 << 30)))
    monkeypatch.setattr(take, "spawn", spawn)
    monkeypatch.setattr(take, "_warmed", lambda *a: ({"ready_s": 1.0}, awake))
    monkeypatch.setattr(take, "_wait_quiet", lambda *a: None)
    monkeypatch.setattr(take, "_check_tree", lambda *a: None)
    monkeypatch.setattr(take, "_dump", dump)
    done = take.take(
        runtime_env(tmp_path), out, Options(image="sha256:" + "1" * 64),
        driver=driver, criu=FakeCriu(1),  # type: ignore[arg-type]
    )  # fmt: skip
    assert done.manifest.device_bytes == (70 << 30) - (500 << 20)
    again = SnapshotManifest.from_json((out / SNAPSHOT_MANIFEST).read_bytes(), source="test")
    assert again.device_bytes == done.manifest.device_bytes


def test_the_rise_is_of_the_gpu_that_rose_most_and_none_where_memory_was_not_asked() -> None:
    before = (_gpu(0, 100), _gpu(1, 100))
    assert rise(before, (_gpu(0, 90), _gpu(1, 400))) == 300
    # A GPU that freed memory meanwhile is no negative need.
    assert rise(before, (_gpu(0, 50), _gpu(1, 100))) == 0
    assert rise((), before) is None and rise(before, ()) is None


def test_takes_weights_choices_are_the_contracts_weights() -> None:
    from kernelbake.cli import build_parser
    from kernelbake.contract.snapshot import Weights

    parser = build_parser()
    take_args = ["snapshot", "take", "--out", "/x", "--image-digest", "sha256:" + "1" * 64, "--weights"]
    for weights in Weights:
        assert Weights(parser.parse_args([*take_args, weights.value]).weights) is weights
    with pytest.raises(SystemExit):
        parser.parse_args([*take_args, "elsewhere"])


def _rollup(proc: Path, pid: int, anonymous_kb: int, swap_kb: int, shmem_kb: int) -> None:
    (proc / str(pid) / "smaps_rollup").write_text(
        "55d0c0000000-7ffd00031000 ---p 00000000 00:00 0    [rollup]\n"
        f"Rss:            {anonymous_kb + 999} kB\nPss_Anon:       {anonymous_kb} kB\n"
        f"Pss_File:          999 kB\nPss_Shmem:      {shmem_kb} kB\nShared_Clean:      999 kB\n"
        f"Anonymous:      {anonymous_kb} kB\nSwap:           {swap_kb} kB\nSwapPss:        {swap_kb} kB\n"
    )


def test_what_a_dump_writes_is_read_from_each_processes_memory(tmp_path: Path) -> None:
    proc = _proc(tmp_path)
    _rollup(proc, 11, anonymous_kb=1000, swap_kb=20, shmem_kb=3)
    # Anonymous, swapped and shared-memory pages are written; file pages (Pss_File) are not.
    assert tree.dumped_bytes(11, proc) == 1023 * 1024
    assert tree.dumped_bytes(12, proc) == 0  # no rollup: a process gone meanwhile
    assert tree.dumped_bytes(99, proc) == 0


@pytest.mark.parametrize("free_mb", [100, 2000])
def test_a_dump_that_would_not_fit_is_refused_before_criu_runs_and_the_device_state_given_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free_mb: int
) -> None:
    """The room a dump needs is asked of the tree after the driver's checkpoint (its processes'
    memory then holds their device state) plus /dev/shm's files: 1.5 GB here, so 100 MB free
    refuses it, saying both numbers, and 2 GB lets CRIU run."""
    proc = _proc(tmp_path)
    for pid in (10, 11, 12):
        _rollup(proc, pid, anonymous_kb=500_000, swap_kb=0, shmem_kb=0)
    monkeypatch.setattr(tree, "dumped_bytes", functools.partial(tree.dumped_bytes, proc=proc))
    driver = FakeDriver()
    # The engine core holds the GPU until the driver checkpoints it.
    monkeypatch.setattr(
        tree,
        "gpu_files",
        lambda pid, proc=tree.PROC: ["/dev/nvidia0"] if pid == 11 and pid not in driver.checkpointed else [],
    )
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "psm_1").write_bytes(b"\0" * 4096)
    monkeypatch.setattr(take, "SHM_DIR", str(shm))
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(take.shutil, "disk_usage", lambda p: usage._replace(free=free_mb * 10**6))
    criu = _DumpingCriu()
    args = (runtime_env(tmp_path), type("P", (), {"pid": 10})(), [10, 11, 12], tmp_path / "out")
    need = 3 * 500_000 * 1024 + 4096 + take.DUMP_SLACK
    if free_mb == 2000:
        taken, _ = take._dump(*args, driver=driver, criu=criu)
        assert criu.dumped == [10] and driver.restored == []
        # Kept for the manifest, so that a run can set the estimate beside what CRIU wrote.
        assert taken["room_need_bytes"] == need
        return
    with pytest.raises(EnvironmentProblem) as err:
        take._dump(*args, driver=driver, criu=criu)
    assert str(err.value) == (
        f"{tmp_path / 'out' / 'images'}: the dump of 3 processes needs about {need} B (their memory, "
        f"{shm}'s files and {take.DUMP_SLACK} B for CRIU's own), and 100000000 B are free there; "
        "take the snapshot onto a larger disk"
    )
    assert criu.dumped == [] and driver.checkpointed == [11] and driver.restored == [11]


def test_take_lists_its_files_in_the_walks_order_and_names_one_it_cannot_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    images = tmp_path / "images"
    (images / "dev-shm").mkdir(parents=True)
    for name, size in (("pages-1.img", 5000), ("core-1.img", 10), ("dev-shm/psm_a", 300)):
        (images / name).write_bytes(b"x" * size)
    (images / "dev-shm/psm_a").chmod(0o600)
    walked = [
        (Path(d) / n).relative_to(tmp_path).as_posix() for d, _s, names in os.walk(images) for n in names
    ]
    files = take._files(tmp_path)
    # The largest is hashed first, yet the manifest keeps the walk's order: the same files, the same bytes.
    assert [f.path for f in files] == walked
    assert {f.path: f.mode for f in files}["images/dev-shm/psm_a"] == 0o600
    assert {f.path: f.size for f in files}["images/pages-1.img"] == 5000

    def unreadable(paths: list[Path], **_kw: object) -> object:
        yield paths[0], PermissionError(13, "Permission denied")

    monkeypatch.setattr(take.hashing, "sha256s", unreadable)
    with pytest.raises(EnvironmentProblem, match="cannot be read to hash it"):
        take._files(tmp_path)
