"""The snapshot path with the real CRIU 4.2.1 (images/base/criu) in real containers: a tree is
taken in one container and restored in a fresh one with only the measured capabilities, through
serve's gate; it answers with the state it had (its request count), its child alive. A tampered
page file in the same snapshot is refused before any restore. Plain Python stands in for the
engine (tests/integration/snapshot_standin.py), so this runs without an engine image."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from kernelbake.contract.snapshot import SNAPSHOT_CAPABILITIES
from tests.conftest import REPO
from tests.support import criu
from tests.support.runtime_target import write_target

pytestmark = pytest.mark.docker

ROOTFS = "kernelbake/debian-rootfs:bookworm"
IMAGE = "sha256:" + "5" * 64


@pytest.fixture(scope="module")
def criu_prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return criu.install(tmp_path_factory.mktemp("criu") / "prefix")


def _docker(
    work: Path,
    criu: Path,
    *args: str,
    env: dict[str, str],
    volumes: tuple[str, ...] = (),
    docker_args: tuple[str, ...] = (),
) -> dict[str, object]:
    if subprocess.run(["docker", "image", "inspect", ROOTFS], capture_output=True).returncode != 0:
        pytest.fail(f"{ROOTFS} is missing: make cpu-base builds it")
    name = f"kb-snapshot-test-{uuid.uuid4().hex[:8]}"
    caps = ["--cap-drop=ALL", *(f"--cap-add={c}" for c in sorted(SNAPSHOT_CAPABILITIES))]
    environ = [f"-e{k}={v}" for k, v in {"PYTHONPATH": "/src", **env}.items()]
    argv = [
        # No capability but the snapshot's set (none of the runtime's defaults), as the recipe.
        "docker", "run", "--rm", "--name", name,
        *caps, "--security-opt=seccomp=unconfined",
        "-v", f"{REPO / 'src'}:/src:ro", "-v", f"{criu}:/opt/kernelbake/criu:ro", "-v", f"{work}:/work",
        *(x for v in volumes for x in ("-v", v)),
        *docker_args, *environ, ROOTFS, "python3", "/work/standin.py", *args,
    ]  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))  # type: ignore[no-any-return]


def _standin(tmp_path: Path, **more: str) -> dict[str, str]:
    """The stand-in and its target under tmp_path (the containers' /work); the environment
    both take and restore run with."""
    write_target(tmp_path, "tiny-llama.yaml")
    (tmp_path / "standin.py").write_text((REPO / "tests/integration/snapshot_standin.py").read_text())
    return {"KERNELBAKE_UNSAFE_TARGET": "/work/target.json", "TMPDIR": "/work/scratch", **more}


def _pinned(base: dict[str, str], digest: str) -> dict[str, str]:
    """What admission sets for a restore of the snapshot ``digest`` of IMAGE."""
    return {
        **base,
        "KERNELBAKE_SNAPSHOT_DIGEST": digest,
        "KERNELBAKE_IMAGE_DIGEST": IMAGE,
        "KERNELBAKE_SNAPSHOT_MARKS": "/work/marks",
    }


def test_a_tree_taken_in_one_container_is_restored_in_a_fresh_one(tmp_path: Path, criu_prefix: Path) -> None:
    base = _standin(tmp_path)
    taken = _docker(tmp_path, criu_prefix, "take", "/work/snapshot", IMAGE, env=base)
    digest = str(taken["digest"])
    restore_env = _pinned(base, digest)
    restored = _docker(tmp_path, criu_prefix, "restore", env=restore_env)
    said = restored["said"]
    assert isinstance(said, list) and said[0].startswith(f"restored snapshot {digest[:19]}"), restored
    # The warm-up's 3 completions are remembered: the memory was restored, not a fresh start.
    assert restored["seen"] == {"count": 3, "child_alive": True}, restored
    assert restored["rc"] == 0
    assert not (tmp_path / "marks").exists()
    assert "checked by sizes and sha256" in said[0], "a bind mount of a directory is hashed"

    # The snapshot as the runtime mounts a pulled image volume: a read-only overlay of its layers
    # alone, bound in read-only. The gate checks sizes and restores without hashing.
    said = _restored_from_overlay(tmp_path, criu_prefix, restore_env)
    assert said[0].startswith(f"restored snapshot {digest[:19]}"), said
    assert "checked by sizes (a read-only overlay of the layers the runtime pulled by digest)" in said[0]

    # The same snapshot with one page file byte flipped: refused, named, nothing restored.
    pages = sorted((tmp_path / "snapshot/images").glob("pages-*.img"))[0]
    data = bytearray(pages.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pages.write_bytes(bytes(data))
    refused = _docker(tmp_path, criu_prefix, "restore", env=restore_env)
    assert refused["rc"] is None and refused["seen"] == {}
    (line,) = refused["said"]  # type: ignore[misc]
    assert f"{pages.relative_to(tmp_path / 'snapshot')}: sha256" in line and "(changed)" in line
    assert not (tmp_path / "marks").exists()


def test_a_container_whose_memory_limit_leaves_too_little_is_refused_before_criu_runs(
    tmp_path: Path, criu_prefix: Path
) -> None:
    """A tree holding 256 MiB, restored in a container limited to 160 MiB: CRIU would be killed
    halfway and the node marked; the gate says what it needs and what the limit leaves, and
    nothing is restored or marked. The same snapshot restores where the limit is not set."""
    base = _standin(tmp_path, STANDIN_HOLD_MB="256")
    digest = str(_docker(tmp_path, criu_prefix, "take", "/work/snapshot", IMAGE, env=base)["digest"])
    restore_env = _pinned(base, digest)
    refused = _docker(tmp_path, criu_prefix, "restore", env=restore_env, docker_args=("--memory=160m",))
    assert refused["rc"] is None and refused["seen"] == {}, refused
    (line,) = refused["said"]  # type: ignore[misc]
    assert "the snapshot's processes and /dev/shm files need " in line, line
    assert (
        "(MemAvailable, and what the container's memory limit leaves); run it with a higher memory limit"
        in line
    )
    need = int(line.split(" files need ")[1].split(" B")[0])
    assert need > 256 << 20, line
    assert not (tmp_path / "marks").exists()
    restored = _docker(tmp_path, criu_prefix, "restore", env=restore_env)
    assert restored["rc"] == 0 and restored["seen"] == {"count": 3, "child_alive": True}, restored


def _restored_from_overlay(tmp_path: Path, criu: Path, env: dict[str, str]) -> list[str]:
    overlay, empty = tmp_path / "overlay", tmp_path / "empty-layer"
    overlay.mkdir()
    empty.mkdir()
    lower = f"lowerdir={empty}:{tmp_path / 'snapshot'}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"ro,{lower}", str(overlay)], check=True)
    try:
        restored = _docker(tmp_path, criu, "restore", env=env, volumes=(f"{overlay}:/work/snapshot:ro",))
    finally:
        subprocess.run(["umount", str(overlay)], check=True)
    assert restored["rc"] == 0 and restored["seen"] == {"count": 3, "child_alive": True}, restored
    said = restored["said"]
    assert isinstance(said, list)
    return said


def test_weights_kept_beside_the_snapshot_come_back_to_the_same_addresses_in_a_fresh_container(
    tmp_path: Path, criu_prefix: Path
) -> None:
    """``take --weights beside`` on a stand-in engine whose weights are its own memory: saved as
    files of the snapshot, unmapped before the dump (the engine asleep), and after the restore
    in a fresh container mapped back and copied in by serve, byte for byte."""
    import hashlib
    import random

    base = _standin(tmp_path, VLLM_SERVER_DEV_MODE="1")
    taken = _docker(tmp_path, criu_prefix, "take", "/work/snapshot", IMAGE, "beside", env=base)
    assert {"save_weights_s", "copy_weights_s"} <= set(taken["taken"])  # type: ignore[arg-type]
    manifest = json.loads((tmp_path / "snapshot/snapshot.json").read_text())
    kept = sorted(f["path"] for f in manifest["files"] if f["path"].startswith("images/weights/"))
    assert kept == ["images/weights/rank-0/index.json", "images/weights/rank-0/part-0000.bin"]
    restore_env = _pinned(base, str(taken["digest"]))
    restored = _docker(tmp_path, criu_prefix, "restore", "beside", env=restore_env)
    said = restored["said"]
    assert isinstance(said, list) and said[0].startswith("restored snapshot"), restored
    assert "weights beside" in said[0] and " woken " in said[0] and " weights copied " in said[0]
    rng = random.Random(7)
    expected = hashlib.sha256(b"".join(rng.randbytes(n) for n in (3 << 20, 1 << 20, 5 << 20))).hexdigest()
    seen = restored["seen"]
    assert isinstance(seen, dict) and seen["weights"] == {"sha256": expected, "asleep": False}, restored
    assert seen["count"] == 3 and restored["rc"] == 0 and not (tmp_path / "marks").exists()
