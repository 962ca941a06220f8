"""serve's snapshot gate: a snapshot is restored only when its pin, marker, key and every file
check out; each refusal is named, happens before any restore, and changes nothing on the node.
One restore attempt: a failed one is killed and marked, and never tried again."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from kernelbake.contract.snapshot import (
    ENGINE_LOG_COPY,
    LOAD_WEIGHTS,
    SNAPSHOT_MANIFEST,
    WEIGHTS_COPY,
    SnapshotFile,
    SnapshotManifest,
    Weights,
    capability_names,
)
from kernelbake.contract.target import TargetConfig
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.runtime.snapshot import machine, volume
from kernelbake.runtime.snapshot import restore as restore_mod
from kernelbake.runtime.snapshot.criu import Criu
from kernelbake.runtime.snapshot.driver import DeviceMemory
from kernelbake.runtime.snapshot.machine import here_key, serve_env
from kernelbake.runtime.snapshot.restore import gate, marker, start_from_snapshot
from tests.runtime.snapshot.fakes import RESTORE_ERROR, FakeCriu, FakeDriver
from tests.support.runtime_target import runtime_env, write_target

IMAGE = "sha256:" + "1" * 64
PAGES = b"\x00pages\xff" * 1000


# The dumped tree's pid: above the kernel's PID_MAX_LIMIT (2**22), so no process here holds it
# and the gate's check that the tree's pids are free passes (a low pid is a kernel thread's).
TREE_PID = 4_194_305


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _snapshot(
    tmp_path: Path,
    port: int,
    *,
    driver: FakeDriver,
    criu: FakeCriu,
    args: tuple[str, ...] = (),
    weights: Weights = Weights.INSIDE,
    gpu_pids: tuple[int, ...] = (),
    more: dict[str, bytes] | None = None,
    rlimits: dict[str, int] | None = None,
    root_mode: int | None = None,
    capabilities: tuple[str, ...] | None = None,
    device_bytes: int | None = None,
) -> str:
    """A snapshot of this machine's key (as recorded by take) under tmp_path/snapshot, with
    ``more`` files (path: bytes) beside CRIU's; its digest."""
    env = runtime_env(tmp_path)
    key = here_key(
        image=IMAGE,
        cache_key=TargetConfig.load(env.target_file).key,
        argv=args,
        environ=env.environ,
        driver=driver,
        criu=criu,  # type: ignore[arg-type]
        weights=weights,
    )
    root = tmp_path / "snapshot"
    (root / "images").mkdir(parents=True)
    (root / "images/pages-1.img").write_bytes(PAGES)
    (root / ENGINE_LOG_COPY).write_bytes(b"engine log\n")
    contents = {"images/pages-1.img": PAGES, ENGINE_LOG_COPY: b"engine log\n", **(more or {})}
    for path, data in (more or {}).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    files = tuple(SnapshotFile(path=p, size=len(d), sha256=_sha(d)) for p, d in contents.items())
    manifest = SnapshotManifest(
        key=key,
        files=files,
        tree=((TREE_PID, "python3 -m vllm"),),
        gpu_pids=gpu_pids,
        health_port=port,
        health_path="/health",
        deadline_s=5.0,
        environment=serve_env(env.environ),
        rlimits=rlimits,
        root_mode=root_mode,
        capabilities=capabilities,
        device_bytes=device_bytes,
    )
    (root / SNAPSHOT_MANIFEST).write_text(manifest.to_json())
    return manifest.digest


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, int]:
    write_target(tmp_path, "tiny-llama.yaml")
    # The restored tree's log goes where it was at dump time; here, under tmp_path.
    monkeypatch.setattr(restore_mod, "ENGINE_LOG", str(tmp_path / "engine-log/engine.log"))
    monkeypatch.setattr(restore_mod, "RELOADING_MARK", str(tmp_path / "engine-log/reloading"))
    (tmp_path / "marks").mkdir()
    return tmp_path, _free_port()


def _env(tmp_path: Path, digest: str | None, image: str | None = IMAGE, **more: str) -> RuntimeEnv:
    extra = {"KERNELBAKE_SNAPSHOT_MARKS": str(tmp_path / "marks"), **more}
    if digest is not None:
        extra["KERNELBAKE_SNAPSHOT_DIGEST"] = digest
    if image is not None:
        extra["KERNELBAKE_IMAGE_DIGEST"] = image
    return runtime_env(tmp_path, **extra)


def _start(
    env: RuntimeEnv, criu: FakeCriu, driver: FakeDriver, args: tuple[str, ...] = ()
) -> tuple[int | None, list[str]]:
    said: list[str] = []
    rc = start_from_snapshot(env, list(args), driver=driver, criu=criu, say=said.append)  # type: ignore[arg-type]
    return rc, said


def test_an_exact_match_restores_once_and_serve_waits_for_the_restored_root(
    setup: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, gpu_pids=(TREE_PID,))
    # CRIU restores the dumped pids; the stand-in's root cannot have pid 7, so the tree below
    # it is said to hold it too.
    real = restore_mod.tree.descendants
    monkeypatch.setattr(restore_mod.tree, "descendants", lambda root, proc=None: [*real(root), TREE_PID])
    # Weights inside: nothing for a reload to read, so nothing is read ahead.
    monkeypatch.setattr(restore_mod.readahead, "start", lambda *a, **k: pytest.fail("read ahead"))
    rc, said = _start(_env(tmp_path, digest), criu, driver)
    assert rc == 0, said
    assert len(criu.restores) == 1 and criu.child is not None
    # The driver gives device state back to the processes take checkpointed, and only them.
    assert driver.restored == [TREE_PID]
    assert said[0].startswith(f"restored snapshot {digest[:19]}")
    assert (tmp_path / "engine-log/engine.log").read_bytes() == b"engine log\n"


@pytest.mark.parametrize(("recorded", "seen_by_criu"), [(0o755, 0o755), (0o700, 0o555)])
def test_the_containers_root_gets_the_owners_write_bit_the_tree_saw_before_criu_restores(
    setup: tuple[Path, int], monkeypatch: pytest.MonkeyPatch, recorded: int, seen_by_criu: int
) -> None:
    """Taken under Docker (/ is 0755), restored under podman (0555): CRIU refused "File . has
    bad mode 040555 (expect 040755)" (the pod test, 2026-12-06). Only that bit is given; any
    other difference is CRIU's to refuse."""
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, root_mode=recorded)
    root = tmp_path / "rootfs"
    root.mkdir(mode=0o555)
    root.chmod(0o555)
    monkeypatch.setattr(restore_mod, "ROOT", root)
    seen: list[int] = []
    real = criu.restore

    def restore(*args: object, **kwargs: object) -> object:
        seen.append(stat.S_IMODE(root.stat().st_mode))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(criu, "restore", restore)
    real_tree = restore_mod.tree.descendants
    monkeypatch.setattr(restore_mod.tree, "descendants", lambda r, proc=None: [*real_tree(r), TREE_PID])
    rc, said = _start(_env(tmp_path, digest), criu, driver)
    assert rc == 0, said
    assert seen == [seen_by_criu]


def test_criu_restore_is_bounded_by_the_deadline_and_a_hang_is_a_failed_restore(
    setup: tuple[Path, int],
) -> None:
    """A CRIU restorer that hit a BUG never returned (podman, 2026-12-06) and serve waited with
    it: the restore now runs under what is left of the snapshot's deadline, and one that runs
    past it is a failed restore (marked, the baked start)."""
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    rc, said = _start(_env(tmp_path, digest), criu, driver)
    assert rc == 0 and len(criu.timeouts) == 1 and 0 < (criu.timeouts[0] or 0) <= 5.0, said
    hung = FakeCriu(port, hangs=True)
    rc, said = _start(_env(tmp_path, digest), hung, driver)
    assert rc is None and "criu restore did not finish within 5 s" in said[0]
    assert "this node is marked" in said[0] and marker(_env(tmp_path, digest), digest).exists()


def test_no_snapshot_mounted_is_the_baked_start_without_a_word(setup: tuple[Path, int]) -> None:
    tmp_path, port = setup
    rc, said = _start(_env(tmp_path, None), FakeCriu(port), FakeDriver())
    assert (rc, said) == (None, [])


def _refused(
    tmp_path: Path, env: RuntimeEnv, criu: FakeCriu, driver: FakeDriver, args: tuple[str, ...] = ()
) -> str:
    """Refused before any restore, nothing marked, the reason printed: that line."""
    rc, said = _start(env, criu, driver, args)
    assert rc is None
    assert criu.restores == [] and driver.restored == []
    assert list((tmp_path / "marks").iterdir()) == []
    assert not (tmp_path / "engine-log").exists()
    (line,) = said
    assert line.startswith("snapshot not used: ") and line.endswith("; starting the baked way")
    return line


def test_a_tampered_page_file_is_refused_and_named(setup: tuple[Path, int]) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    pages = tmp_path / "snapshot/images/pages-1.img"
    data = bytearray(pages.read_bytes())
    data[100] ^= 1
    pages.write_bytes(bytes(data))
    line = _refused(tmp_path, _env(tmp_path, digest), criu, driver)
    assert "images/pages-1.img: sha256" in line and "(changed)" in line


def test_a_truncated_image_is_refused_without_hashing_a_byte(
    setup: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hashing tens of GB takes seconds the baked start would wait for; a wrong size needs none.
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    pages = tmp_path / "snapshot/images/pages-1.img"
    pages.write_bytes(pages.read_bytes()[:10])

    def no_hashing(paths: object, **_kw: object) -> object:
        raise AssertionError("hashed although a size was wrong")

    monkeypatch.setattr(restore_mod.hashing, "sha256s", no_hashing)
    line = _refused(tmp_path, _env(tmp_path, digest), criu, driver)
    assert f"images/pages-1.img: 10 B, {len(PAGES)} B recorded (truncated or replaced)" in line


def test_a_missing_or_unlisted_file_is_refused(setup: tuple[Path, int]) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    (tmp_path / "snapshot/images/core-1.img").write_bytes(b"x")
    assert "images/core-1.img: not listed" in _refused(tmp_path, _env(tmp_path, digest), criu, driver)
    (tmp_path / "snapshot/images/core-1.img").unlink()
    (tmp_path / "snapshot/images/pages-1.img").unlink()
    assert "images/pages-1.img: missing" in _refused(tmp_path, _env(tmp_path, digest), criu, driver)


def test_a_foreign_key_is_refused_with_its_fields(setup: tuple[Path, int]) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    write_target(tmp_path, "tiny-llama-torch.yaml")  # another image's target.json, same paths
    line = _refused(tmp_path, _env(tmp_path, digest), criu, driver)
    assert "cache key" in line and "recorded" in line


def test_another_image_digest_is_refused(setup: tuple[Path, int]) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    other = "sha256:" + "2" * 64
    line = _refused(tmp_path, _env(tmp_path, digest, image=other), criu, driver)
    assert f"image {IMAGE} recorded, {other} here" in line
    assert "KERNELBAKE_IMAGE_DIGEST is unset" in _refused(
        tmp_path, _env(tmp_path, digest, image=None), criu, driver
    )


def test_another_gpu_model_or_driver_is_refused_and_named(setup: tuple[Path, int]) -> None:
    tmp_path, port = setup
    recorded = FakeDriver(gpu="NVIDIA H200, 143771 MiB, 132 SMs", driver="580.159.04", api="13000", count=1)
    criu = FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=recorded, criu=criu)
    other_driver = FakeDriver(
        gpu="NVIDIA H200, 143771 MiB, 132 SMs", driver="580.95.05", api="13000", count=1
    )
    line = _refused(tmp_path, _env(tmp_path, digest), criu, other_driver)
    assert line == "snapshot not used: driver 580.159.04 recorded, 580.95.05 here; starting the baked way"
    other_gpu = FakeDriver(
        gpu="NVIDIA H100 80GB HBM3, 81559 MiB, 132 SMs", driver="580.159.04", api="13000", count=1
    )
    line = _refused(tmp_path, _env(tmp_path, digest), criu, other_gpu)
    assert "GPU NVIDIA H200, 143771 MiB, 132 SMs recorded, NVIDIA H100 80GB HBM3" in line


def test_other_serve_args_or_env_are_refused(setup: tuple[Path, int]) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    assert "serve args [] recorded" in _refused(
        tmp_path, _env(tmp_path, digest), criu, driver, ("--max-num-seqs", "4")
    )
    # By name, never by value (a variable here may hold a secret).
    line = _refused(tmp_path, _env(tmp_path, digest, VLLM_FOO="s3cr3t"), criu, driver)
    assert "serve env differs (VLLM_FOO set here, not recorded)" in line and "s3cr3t" not in line
    # What the kubelet, the device plugin and the container runtime (podman: container, TERM)
    # set per pod is no difference.
    volatile = _env(
        tmp_path,
        digest,
        KUBERNETES_SERVICE_HOST="10.0.0.1",
        NVIDIA_VISIBLE_DEVICES="GPU-9",
        container="podman",
        TERM="xterm",
    )
    gated = gate(volatile, (), driver=driver, criu=criu)  # type: ignore[arg-type]
    assert gated is not None and gated.reasons == ()


def test_hard_limits_lower_here_are_refused_unless_criu_may_raise_them(
    setup: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken under Docker's NOFILE 1048576, restored under podman's 16384: CRIU would fail on
    setrlimit halfway (the pod test, 2026-12-06); the gate says so first, naming the limit."""
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    taken = {"NOFILE": 1048576, "NPROC": -1}
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, rlimits=taken)
    monkeypatch.setattr(restore_mod, "hard_rlimits", lambda: {"NOFILE": 16384, "NPROC": -1})
    monkeypatch.setattr(restore_mod, "may_raise_rlimits", lambda: False)
    line = _refused(tmp_path, _env(tmp_path, digest), criu, driver)
    assert "hard limits lower here than the snapshot's tree had (NOFILE 16384 here, 1048576 recorded)" in line
    assert "--ulimit" in line
    for limits, may_raise in ((taken, False), ({"NOFILE": 16384, "NPROC": -1}, True)):
        monkeypatch.setattr(restore_mod, "hard_rlimits", lambda limits=limits: limits)
        monkeypatch.setattr(restore_mod, "may_raise_rlimits", lambda may_raise=may_raise: may_raise)
        gated = gate(_env(tmp_path, digest), (), driver=driver, criu=criu)  # type: ignore[arg-type]
        assert gated is not None and gated.reasons == (), gated


# Docker's default capabilities and podman's (CapBnd 0xa80425fb and 0x800405fb, both measured
# on this host, 2026-12-06).
DOCKER_CAPS = capability_names(0xA80425FB)
PODMAN_CAPS = capability_names(0x800405FB)


def test_capabilities_this_container_cannot_give_are_refused_by_name(
    setup: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken under Docker's default set, restored under podman's: CRIU's capset would fail
    ("Unable to restore capabilities"); the gate names the three podman lacks, and lets a
    snapshot restore where the set is the same or larger, or was never recorded."""
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, capabilities=DOCKER_CAPS)
    monkeypatch.setattr(restore_mod, "grantable_capabilities", lambda: PODMAN_CAPS)
    line = _refused(tmp_path, _env(tmp_path, digest), criu, driver)
    assert "cannot give them (AUDIT_WRITE, MKNOD, NET_RAW): take and restore with one set" in line
    assert "--cap-drop ALL and NET_ADMIN, SETGID, SYS_ADMIN, SYS_CHROOT, SYS_TIME" in line
    monkeypatch.setattr(restore_mod, "grantable_capabilities", lambda: None)
    assert "(AUDIT_WRITE, CHOWN, " in _refused(tmp_path, _env(tmp_path, digest), criu, driver)
    for here in (DOCKER_CAPS, (*DOCKER_CAPS, "SYS_ADMIN", "SYS_TIME")):
        monkeypatch.setattr(restore_mod, "grantable_capabilities", lambda here=here: here)
        gated = gate(_env(tmp_path, digest), (), driver=driver, criu=criu)  # type: ignore[arg-type]
        assert gated is not None and gated.reasons == (), gated
    monkeypatch.setattr(restore_mod, "grantable_capabilities", lambda: PODMAN_CAPS)
    digest = _snapshot_again(tmp_path, port, driver, criu, capabilities=PODMAN_CAPS)
    gated = gate(_env(tmp_path, digest), (), driver=driver, criu=criu)  # type: ignore[arg-type]
    assert gated is not None and gated.reasons == (), gated


GIB = 1 << 30


def _gpu(index: int, free_gib: float, total_gib: float = 80) -> DeviceMemory:
    free = int(free_gib * GIB)
    return DeviceMemory(index=index, total=int(total_gib * GIB), free=free, used=int(total_gib * GIB) - free)


def test_a_gpu_without_the_memory_the_engine_held_is_refused_before_criu_and_nothing_is_marked(
    setup: tuple[Path, int],
) -> None:
    """Another process holds the GPU: a restore would run out of memory in the driver's restore
    or vLLM's wake-up and mark this node for the snapshot for good; the gate says so first, names
    the GPU with the least free, and restores once the memory is there again."""
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, device_bytes=70 * GIB)
    driver.memories = [(_gpu(0, 79), _gpu(1, 4))]
    line = _refused(tmp_path, _env(tmp_path, digest), criu, driver)
    assert f"GPU 1 has {4 * GIB} B free ({76 * GIB} of its {80 * GIB} B in use), " in line
    assert f"and the snapshot's engine held {70 * GIB} B" in line
    for memories in ([(_gpu(0, 70),)], [(_gpu(0, 79), _gpu(1, 75))], []):
        driver.memories = memories
        gated = gate(_env(tmp_path, digest), (), driver=driver, criu=criu)  # type: ignore[arg-type]
        assert gated is not None and gated.reasons == (), (memories, gated)


def test_a_snapshot_that_recorded_no_device_memory_is_not_held_to_one(setup: tuple[Path, int]) -> None:
    """A snapshot.json from before ``device_bytes``, or one taken where NVML did not answer."""
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    driver.memories = [(_gpu(0, 0.5),)]
    gated = gate(_env(tmp_path, digest), (), driver=driver, criu=criu)  # type: ignore[arg-type]
    assert gated is not None and gated.reasons == (), gated


def test_a_container_without_the_memory_criu_restores_into_is_refused_before_criu(
    setup: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The processes' pages and /dev/shm's copy come back into memory; a container whose limit
    leaves less would be killed halfway and the node marked. The weights beside do not count
    (copied to the GPU from the file), nor CRIU's other images."""
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    more = {"images/dev-shm/psm_1": b"s" * 7, "images/weights/rank-0/pages-0.bin": b"w" * 1000}
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, more=more)
    need = len(PAGES) + 7
    monkeypatch.setattr(restore_mod, "memory_room", lambda: need - 1)
    line = _refused(tmp_path, _env(tmp_path, digest), criu, driver)
    assert f"the snapshot's processes and /dev/shm files need {need} B of memory, and {need - 1} B" in line
    assert "run it with a higher memory limit" in line
    for room in (need, None):
        monkeypatch.setattr(restore_mod, "memory_room", lambda room=room: room)
        gated = gate(_env(tmp_path, digest), (), driver=driver, criu=criu)  # type: ignore[arg-type]
        assert gated is not None and gated.reasons == (), (room, gated)


def _memory(tmp_path: Path, available_kib: int, cgroup: dict[str, str] | None) -> tuple[Path, Path]:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: 99999999 kB\nMemAvailable: {available_kib} kB\n")
    root = tmp_path / "cgroup"
    root.mkdir(exist_ok=True)
    for name, text in (cgroup or {}).items():
        (root / name).write_text(text)
    return meminfo, root


def test_the_memory_room_is_the_nodes_and_no_more_than_the_limit_leaves_page_cache_counted(
    tmp_path: Path,
) -> None:
    from kernelbake.runtime.snapshot.machine import memory_room

    tmp = tmp_path
    # No limit of its own (or no cgroup v2 files): the node's MemAvailable.
    assert memory_room(*_memory(tmp, 1000, None)) == 1000 * 1024
    stat = "anon 100\nfile 5000\nshmem 1000\n"
    files = {"memory.max": "max\n", "memory.current": "9000\n", "memory.stat": stat}
    assert memory_room(*_memory(tmp, 1000, files)) == 1000 * 1024
    # A limit of 10000 B with 9000 B charged, 4000 of them page cache the kernel reclaims
    # (5000 file less 1000 tmpfs): 5000 B.
    assert memory_room(*_memory(tmp, 1000, {**files, "memory.max": "10000\n"})) == 5000
    # The node's own MemAvailable still bounds it.
    assert memory_room(*_memory(tmp, 1, {**files, "memory.max": "10000\n"})) == 1024
    # Nothing readable: nothing is checked.
    assert memory_room(tmp / "none", tmp / "none") is None
    # cgroup v1 (Docker on a v1 host: the container's own under memory/), cache less shmem.
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory/memory.limit_in_bytes").write_text("10000\n")
    (v1 / "memory/memory.usage_in_bytes").write_text("9000\n")
    (v1 / "memory/memory.stat").write_text("cache 5000\nrss 100\nshmem 1000\ntotal_cache 5000\n")
    assert memory_room(_memory(tmp, 1000, None)[0], v1) == 5000
    (v1 / "memory/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memory_room(_memory(tmp, 1000, None)[0], v1) == 1000 * 1024


def _snapshot_again(tmp_path: Path, port: int, driver: FakeDriver, criu: FakeCriu, **kw: Any) -> str:
    shutil.rmtree(tmp_path / "snapshot")
    return _snapshot(tmp_path, port, driver=driver, criu=criu, **kw)


def test_the_capabilities_a_process_holds_and_those_this_container_grants_are_read_from_proc(
    tmp_path: Path,
) -> None:
    for pid, (prm, eff, inh) in {
        1: (0x1, 0x1, 0x0),
        2: (0x2000, 0x0, 0x20000000),
        3: (0, 0, 1 << 41),
    }.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(
            f"Name:\tpython3\nCapInh:\t{inh:016x}\nCapPrm:\t{prm:016x}\nCapEff:\t{eff:016x}\n"
            "CapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\n"
        )
    assert machine.held_capabilities([1, 2], tmp_path) == ("AUDIT_WRITE", "CHOWN", "NET_RAW")
    assert machine.held_capabilities([3, 99], tmp_path) == ("BIT_41",)  # 99: gone meanwhile
    assert machine.grantable_capabilities(tmp_path / "1/status") == capability_names((1 << 41) - 1)
    assert machine.grantable_capabilities(tmp_path / "99/status") is None
    assert machine.may_raise_rlimits(tmp_path / "1/status") is False


def test_an_unpinned_or_other_snapshot_json_is_refused(setup: tuple[Path, int]) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    assert "KERNELBAKE_SNAPSHOT_DIGEST is unset" in _refused(tmp_path, _env(tmp_path, None), criu, driver)
    other = "sha256:" + "3" * 64
    assert f"admission verified {other}" in _refused(tmp_path, _env(tmp_path, other), criu, driver)
    # An edited snapshot.json (a foreign key written in) no longer has the pinned digest.
    path = tmp_path / "snapshot" / SNAPSHOT_MANIFEST
    path.write_text(path.read_text().replace('"deadline_s": 5.0', '"deadline_s": 50.0'))
    assert "admission verified" in _refused(tmp_path, _env(tmp_path, digest), criu, driver)


@pytest.mark.parametrize("how", ["criu fails", "no /health"])
def test_a_failed_restore_is_killed_marked_and_never_tried_again(setup: tuple[Path, int], how: str) -> None:
    tmp_path, port = setup
    driver = FakeDriver()
    criu = FakeCriu(port, restore_ok=how != "criu fails", healthy=False, serve_s=30.0)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    env = _env(tmp_path, digest)
    rc, said = _start(env, criu, driver)
    assert rc is None and len(criu.restores) == 1
    if criu.child is not None:
        assert criu.ended()  # killed, not left serving
    assert marker(env, digest).exists()
    assert "this node is marked" in said[0] and said[0].endswith("starting the baked way")
    if how == "criu fails":
        # CRIU's own reason, not only where its log was.
        assert f"criu restore failed: {RESTORE_ERROR}; Restoring FAILED." in said[0]
    # The next start (a restarted container) does not try again.
    rc, said = _start(env, criu, driver)
    assert rc is None and len(criu.restores) == 1
    assert said == [
        f"snapshot not used: a restore of {digest[:19]} failed on this node before ({marker(env, digest)}); starting the baked way"
    ]


def test_a_restored_tree_that_ends_before_health_is_named_so_at_once(setup: tuple[Path, int]) -> None:
    """Not "did not answer within 5 s": the tree's end is what failed, and it is said with its
    exit code (the deadline's message would be the other one)."""
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port, healthy=False, serve_s=0.3)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    env = _env(tmp_path, digest)
    rc, said = _start(env, criu, driver)
    assert rc is None and marker(env, digest).exists()
    assert "the restored tree exited with code 0 " in said[0], said
    assert f"before http://127.0.0.1:{port}/health answered 200" in said[0], said


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("import sys; sys.exit(3)", "exited with code 3"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "was killed by signal 9"),
    ],
)
def test_how_the_restored_root_ended_is_kept_once_it_is_reaped(body: str, said: str) -> None:
    # A bare pid, as CRIU's pidfile gives it: no Popen left to warn that its child ran on.
    root = restore_mod._Root(os.posix_spawn(sys.executable, [sys.executable, "-c", body], os.environ))
    end = time.monotonic() + 30
    while root.alive() and time.monotonic() < end:
        time.sleep(0.02)
    # Asked again after the reap: still ended, still the same words.
    assert (root.alive(), root.ended) == (False, said)


def test_a_restored_tree_without_a_checkpointed_pid_is_a_failed_restore(setup: tuple[Path, int]) -> None:
    """The driver holds device state for the tree's pid; a tree CRIU brought back without it cannot be
    given that state: killed and marked, the pid named, the driver never called."""
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port, serve_s=30.0)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, gpu_pids=(TREE_PID,))
    env = _env(tmp_path, digest)
    rc, said = _start(env, criu, driver)
    assert rc is None and criu.child is not None and criu.ended()
    assert driver.restored == [] and marker(env, digest).exists()
    assert f"criu restored no process with pid {TREE_PID}, whose device state the driver holds" in said[0]


def test_criu_missing_here_is_a_refusal_not_a_traceback(setup: tuple[Path, int]) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    env = _env(tmp_path, digest)
    said: list[str] = []
    rc = start_from_snapshot(env, [], driver=driver, criu=Criu(tmp_path / "no-criu"), say=said.append)
    assert rc is None and "command not found" in said[0]


# Verified once per node: on an image volume the runtime pulled (runtime.snapshot.volume).
_BASE = "1 0 0:30 / / rw,relatime - overlay overlay rw,lowerdir=/l1:/l2,upperdir=/u,workdir=/w\n"


def _as_pulled(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    line = f"2 1 0:40 / {root} ro,relatime - overlay overlay ro,lowerdir=/v/2/fs:/v/1/fs\n"
    monkeypatch.setattr(volume, "_read", lambda: _BASE + line)


def test_on_a_pulled_volume_sizes_are_checked_and_sha256_is_not(
    setup: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    pages = tmp_path / "snapshot/images/pages-1.img"
    data = bytearray(pages.read_bytes())
    data[100] ^= 1
    pages.write_bytes(bytes(data))
    env = _env(tmp_path, digest)
    # Hashed where the mount is no pulled image volume: the changed byte is named.
    assert "images/pages-1.img: sha256" in _refused(tmp_path, env, criu, driver)
    _as_pulled(monkeypatch, tmp_path / "snapshot")
    gated = gate(env, (), driver=driver, criu=criu)  # type: ignore[arg-type]
    assert gated is not None and gated.reasons == ()
    assert gated.checked.startswith("2 files checked by sizes (a read-only overlay of the layers")
    pages.write_bytes(bytes(data[:-1]))
    assert "images/pages-1.img: 6999 B, 7000 B recorded (truncated or replaced)" in _refused(
        tmp_path, env, criu, driver
    )
    pages.write_bytes(bytes(data))
    (tmp_path / "snapshot/images/extra.img").write_bytes(b"x")
    assert "images/extra.img: not listed" in _refused(tmp_path, env, criu, driver)


def test_a_hashed_gate_says_so(setup: tuple[Path, int]) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    gated = gate(_env(tmp_path, digest), (), driver=driver, criu=criu)  # type: ignore[arg-type]
    assert gated is not None and gated.checked.startswith("2 files checked by sizes and sha256 (")


# Weights left out: the restored engine is woken and its weights reloaded before serve says so.


def test_a_snapshot_taken_asleep_is_woken_and_reloaded_after_health(
    setup: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    criu.calls = tmp_path / "calls.txt"
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, weights=Weights.OUTSIDE)
    # The snapshot's images (CRIU reads them first) and then the weights the reload reads are
    # read beside the restore, the weights from the key's model path, and serve's line says how
    # far that got.
    read_ahead: list[Path] = []
    seen: list[str] = []
    snapshot_root = _env(tmp_path, digest).snapshot_root

    def start(model: Path, images: Sequence[Path] = ()) -> restore_mod.readahead.ReadAhead:
        read_ahead.append(model)
        seen.extend(str(p.relative_to(snapshot_root)) for p in images)
        return restore_mod.readahead.ReadAhead([*images, model / "model.safetensors"], 10, images=len(images))

    monkeypatch.setattr(restore_mod.readahead, "start", start)
    rc, said = _start(_env(tmp_path, digest), criu, driver)
    assert rc == 0, said
    model = TargetConfig.load(runtime_env(tmp_path).target_file).key.model_path
    assert read_ahead == [Path(model)]
    manifest = json.loads((snapshot_root / "snapshot.json").read_text())
    listed = sorted(f["path"] for f in manifest["files"] if f["path"].startswith("images/"))
    assert seen == listed and any(p.startswith("images/pages-") for p in seen)
    n = len(listed)
    assert (
        f"; 0 B read ahead beside it (the snapshot's {n} image files, then 1 weight file); the engine's"
        in said[0]
    )
    wake, reload = criu.calls.read_text().splitlines()
    path, _, body = reload.partition(" ")
    assert wake == "/wake_up {}" and path == "/collective_rpc"
    assert json.loads(body)["method"] == "reload_weights" and json.loads(body)["kwargs"] == {}
    assert "weights outside" in said[0] and "woken " in said[0] and "weights reloaded " in said[0]


def test_health_is_held_until_the_weights_are_back_and_released_either_way(
    setup: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """devguard answers /health 503 while the mark exists: it must exist while the engine is
    woken and reloaded, and be gone once serve says it serves, after a failed reload (the baked
    start's /health must answer), and when a killed serve left it behind."""
    tmp_path, port = setup
    mark = Path(restore_mod.RELOADING_MARK)
    seen: list[bool] = []
    real = restore_mod._awake

    def awake(*args: object) -> str | None:
        seen.append(mark.exists())
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(restore_mod, "_awake", awake)
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, weights=Weights.OUTSIDE)
    rc, said = _start(_env(tmp_path, digest), criu, driver)
    assert rc == 0, said
    assert seen == [True] and not mark.exists()
    criu = FakeCriu(port, reload_ok=False, serve_s=30.0)
    (tmp_path / "snapshot").rename(tmp_path / "snapshot-first")
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, weights=Weights.OUTSIDE)
    rc, said = _start(_env(tmp_path, digest), criu, driver)
    assert rc is None and seen == [True, True] and not mark.exists()
    mark.write_text("")
    rc, said = _start(_env(tmp_path, None), FakeCriu(port), FakeDriver())
    assert rc is None and "starting the baked way" in said[0] and not mark.exists()


def test_a_reload_that_fails_is_a_failed_restore(setup: tuple[Path, int]) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port, reload_ok=False, serve_s=30.0)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, weights=Weights.OUTSIDE)
    env = _env(tmp_path, digest)
    rc, said = _start(env, criu, driver)
    assert rc is None and criu.child is not None and criu.ended()
    assert marker(env, digest).exists()
    assert "/collective_rpc reload_weights answered 500" in said[0] and "this node is marked" in said[0]
    # A snapshot taken with its weights inside is never woken: nothing was posted.
    driver, criu = FakeDriver(), FakeCriu(port)
    criu.calls = tmp_path / "calls-inside.txt"
    (tmp_path / "snapshot").rename(tmp_path / "snapshot-asleep")
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu)
    rc, said = _start(_env(tmp_path, digest), criu, driver)
    assert rc == 0 and not criu.calls.exists() and "weights inside" in said[0]


# Weights beside: the restored engine is woken and the snapshot's copy of its weight memory put
# back by the worker extension, with no reload.
BESIDE = {
    "images/weights/index.json": b'{"schema": 1, "blocks": []}',
    "images/weights/part-0000.bin": b"\x01" * 300,
}


def test_a_snapshot_with_its_weights_beside_is_woken_and_its_copy_put_back(
    setup: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    criu.calls = tmp_path / "calls.txt"
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, weights=Weights.BESIDE, more=BESIDE)
    snapshot_root = _env(tmp_path, digest).snapshot_root
    started: list[tuple[Path | None, list[str]]] = []

    def start(model: Path | None, images: Sequence[Path] = ()) -> restore_mod.readahead.ReadAhead:
        started.append((model, [str(p.relative_to(snapshot_root)) for p in images]))
        return restore_mod.readahead.ReadAhead(list(images), 10, images=len(images))

    monkeypatch.setattr(restore_mod.readahead, "start", start)
    rc, said = _start(_env(tmp_path, digest), criu, driver)
    assert rc == 0, said
    # No model files: the weights are the snapshot's own, read after CRIU's images.
    assert started == [
        (None, ["images/engine.log", "images/pages-1.img", *sorted(BESIDE)]),
    ]
    wake, copied = criu.calls.read_text().splitlines()
    assert wake == "/wake_up {}"
    path, _, body = copied.partition(" ")
    asked = json.loads(body)
    assert path == "/collective_rpc" and asked["method"] == LOAD_WEIGHTS
    assert asked["kwargs"] == {"path": str(snapshot_root / WEIGHTS_COPY)} and asked["timeout"] > 0
    assert "weights beside" in said[0] and "woken " in said[0] and "weights copied " in said[0]
    assert "weights reloaded" not in said[0]


def test_a_copy_that_fails_is_a_failed_restore(setup: tuple[Path, int]) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port, reload_ok=False, serve_s=30.0)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, weights=Weights.BESIDE, more=BESIDE)
    env = _env(tmp_path, digest)
    rc, said = _start(env, criu, driver)
    assert rc is None and criu.child is not None and criu.ended()
    assert marker(env, digest).exists() and not Path(restore_mod.RELOADING_MARK).exists()
    assert f"/collective_rpc {LOAD_WEIGHTS} answered 500" in said[0] and "this node is marked" in said[0]


def test_a_tampered_weights_file_beside_is_refused_before_any_restore(setup: tuple[Path, int]) -> None:
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    digest = _snapshot(tmp_path, port, driver=driver, criu=criu, weights=Weights.BESIDE, more=BESIDE)
    part = tmp_path / "snapshot/images/weights/part-0000.bin"
    part.write_bytes(b"\x02" * 300)
    rc, said = _start(_env(tmp_path, digest), criu, driver)
    assert rc is None and criu.restores == []
    assert "images/weights/part-0000.bin: sha256" in said[0] and "changed" in said[0]


def _refused_with_tree_pid(setup: tuple[Path, int], pid: int) -> tuple[str, FakeCriu]:
    """Serve's line for a snapshot whose tree names ``pid`` (held here), and the CRIU asked."""
    tmp_path, port = setup
    driver, criu = FakeDriver(), FakeCriu(port)
    _snapshot(tmp_path, port, driver=driver, criu=criu)
    manifest = SnapshotManifest.from_json(
        (tmp_path / "snapshot" / SNAPSHOT_MANIFEST).read_bytes(), source="test"
    )
    held = dataclasses.replace(manifest, tree=((pid, "python3 -m vllm"), (TREE_PID, "engine")))
    (tmp_path / "snapshot" / SNAPSHOT_MANIFEST).write_text(held.to_json())
    return _refused(tmp_path, _env(tmp_path, held.digest), criu, driver), criu


def _until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_tree_pid_in_use_here_is_refused_before_criu_runs(setup: tuple[Path, int]) -> None:
    """CRIU gives each process its pid back; where one is taken (a host's second restore, the
    H100 of 2026-12-06), it failed halfway and marked the node. The gate names the pid and its
    command first, and nothing is tried or marked."""
    taken = subprocess.Popen(["sleep", "30"])
    # Until it has exec'd, the child's cmdline is this test's interpreter (a fork of it): the
    # gate would name that, and the assertion below would fail once in a while.
    _until(lambda: Path(f"/proc/{taken.pid}/cmdline").read_bytes() == b"sleep\x0030\x00")
    try:
        line, criu = _refused_with_tree_pid(setup, taken.pid)
    finally:
        taken.kill()
        taken.wait()
    assert f"pid {taken.pid} (sleep 30) of the snapshot's tree is in use here" in line
    assert "a pid namespace of its own" in line and "--init" not in line and criu.restores == []


def test_a_tree_pid_held_by_an_unreaped_process_says_so_and_how_to_reap_it(setup: tuple[Path, int]) -> None:
    """A take and a restore in one container whose pid 1 reaps nothing: the dumped tree's
    orphans stay zombies, with no command line, and hold their pids (2026-12-07)."""
    exited = subprocess.Popen(["true"])
    _until(lambda: Path(f"/proc/{exited.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z")
    try:
        line, criu = _refused_with_tree_pid(setup, exited.pid)
    finally:
        exited.wait()
    assert f"pid {exited.pid} (exited, not reaped by its parent {os.getpid()})" in line
    assert "docker run --init" in line and criu.restores == []
