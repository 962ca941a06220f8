from __future__ import annotations

import json

import pytest
from hypothesis import given

from kernelbake.contract.key import CacheKey
from kernelbake.contract.snapshot import (
    UNLIMITED,
    InvalidSnapshot,
    SnapshotFile,
    SnapshotKey,
    SnapshotManifest,
    Weights,
    capability_names,
    differences,
    env_changes,
    env_digest,
    lower_limits,
    parse_snapshot_key,
)
from kernelbake.plan import plan
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.support.strategies import snapshot_keys


@given(snapshot_keys())
def test_canonical_string_round_trips(key: SnapshotKey) -> None:
    assert parse_snapshot_key(str(key)) == key
    assert parse_snapshot_key(str(key)).digest == key.digest


@given(snapshot_keys())
def test_a_key_differs_from_itself_nowhere(key: SnapshotKey) -> None:
    assert list(differences(key, key)) == []


def cpu_key(**changes: object) -> SnapshotKey:
    base = SnapshotKey(
        image="sha256:" + "a" * 64,
        cache_key=_cache_key(),
        gpu="none",
        gpu_count=0,
        driver="none",
        cuda_driver_api="none",
        kernel="6.18.44-fc-v1252",
        criu="4.1.1",
        criu_features="none",
        cpu="AMD EPYC",
        cpu_flags="sse avx2 avx512f",
        serve_args='["vllm", "serve"]',
        serve_env=env_digest({"A": "1"}),
        weights=Weights.INSIDE,
    )
    return base.replace(**changes)


def _cache_key() -> CacheKey:
    return plan(load_spec(REPO / "images/tiny-llama.yaml"), ["cpu"])[0].key


def test_the_named_field_is_the_one_that_differs() -> None:
    recorded = cpu_key(driver="580.159.04")
    here = cpu_key(driver="580.95.05")
    assert list(differences(recorded, here)) == ["driver 580.159.04 recorded, 580.95.05 here"]


def test_differences_come_in_field_order_and_name_cpu_flags() -> None:
    recorded = cpu_key()
    here = cpu_key(image="sha256:" + "b" * 64, gpu="NVIDIA H200", cpu_flags="sse avx2 amx_tile")
    found = list(differences(recorded, here))
    assert found[0].startswith("image sha256:aaa")
    assert found[1] == "GPU none recorded, NVIDIA H200 here"
    assert found[2] == "CPU flags differ (missing here: avx512f; new here: amx_tile)"


def test_an_environment_differs_by_its_variables_names_never_their_values() -> None:
    was = {"A": "1", "B": "2", "C": "3"}
    now = {"A": "1", "B": "token-x", "D": "4"}
    recorded, here = cpu_key(serve_env=env_digest(was)), cpu_key(serve_env=env_digest(now))
    (line,) = differences(recorded, here, (was, now))
    assert line == "serve env differs (B another value here; C unset here; D set here, not recorded)"
    # Without the recorded environment (an older snapshot.json), the digests.
    (line,) = differences(recorded, here)
    assert line == f"serve env {env_digest(was)} recorded, {env_digest(now)} here"
    many = {f"V{i:02}": "x" for i in range(12)}
    assert env_changes({}, many).endswith("V07 set here, not recorded; 4 more")


def test_limits_lower_here_are_named_and_unlimited_is_above_any() -> None:
    recorded = {"NOFILE": 1048576, "NPROC": UNLIMITED, "STACK": UNLIMITED, "CORE": 0}
    here = {"NOFILE": 16384, "NPROC": 32768, "STACK": UNLIMITED, "CORE": 0}
    assert lower_limits(recorded, here) == [
        "NOFILE 16384 here, 1048576 recorded",
        "NPROC 32768 here, unlimited recorded",
    ]
    assert lower_limits(recorded, {**here, "NOFILE": UNLIMITED, "NPROC": UNLIMITED}) == []
    assert lower_limits({"RTTIME": 5}, {}) == ["RTTIME unknown here, 5 recorded"]


def test_a_manifests_limits_round_trip_and_junk_is_refused() -> None:
    manifest = _manifest(rlimits={"NOFILE": 1048576, "NPROC": UNLIMITED}, root_mode=0o755)
    back = SnapshotManifest.from_json(manifest.to_json(), source="t")
    assert back.rlimits == {"NOFILE": 1048576, "NPROC": -1} and back.digest == manifest.digest
    assert back.root_mode == 0o755
    doc = json.loads(manifest.to_json())
    for junk in ({"NOFILE": "many"}, {"nofile": 1}, {"NOFILE": -2}, {"NOFILE": True}, ["NOFILE"]):
        with pytest.raises(InvalidSnapshot, match="rlimits must map"):
            SnapshotManifest.from_json(json.dumps({**doc, "rlimits": junk}), source="t")
    for mode in (-1, 0o10000, "755", 7.5):
        with pytest.raises(InvalidSnapshot, match="is not permission bits"):
            SnapshotManifest.from_json(json.dumps({**doc, "root_mode": mode}), source="t")


def test_a_manifests_device_bytes_round_trip_and_junk_is_refused() -> None:
    manifest = _manifest(device_bytes=71_940_702_208)
    back = SnapshotManifest.from_json(manifest.to_json(), source="t")
    assert back.device_bytes == 71_940_702_208 and back.digest == manifest.digest
    # A snapshot.json from before the field: nothing recorded, and none written.
    assert "device_bytes" not in json.loads(_manifest().to_json())
    doc = json.loads(manifest.to_json())
    for junk in (-1, "70G", 7.5, True):
        with pytest.raises(InvalidSnapshot, match="is not a count of bytes"):
            SnapshotManifest.from_json(json.dumps({**doc, "device_bytes": junk}), source="t")


def test_a_manifests_capabilities_round_trip_sorted_and_junk_is_refused() -> None:
    manifest = _manifest(capabilities=("NET_RAW", "CHOWN", "BIT_41", "CHOWN"))
    back = SnapshotManifest.from_json(manifest.to_json(), source="t")
    assert back.capabilities == ("BIT_41", "CHOWN", "NET_RAW") and back.digest == manifest.digest
    assert json.loads(manifest.to_json())["capabilities"] == ["BIT_41", "CHOWN", "NET_RAW"]
    assert "capabilities" not in json.loads(_manifest().to_json())
    doc = json.loads(manifest.to_json())
    for junk in ("CHOWN", [1], ["cap_chown"], ["CHOWN; rm"], ["X"] * 65, {"CHOWN": 1}):
        with pytest.raises(InvalidSnapshot, match="capabilities must list"):
            SnapshotManifest.from_json(json.dumps({**doc, "capabilities": junk}), source="t")


def test_capabilities_are_named_from_their_bits_as_docker_names_them() -> None:
    assert capability_names(0) == ()
    assert capability_names(1 | 1 << 21 | 1 << 40 | 1 << 63) == (
        "BIT_63",
        "CHECKPOINT_RESTORE",
        "CHOWN",
        "SYS_ADMIN",
    )
    # Docker's default set (CapBnd 0xa80425fb) less podman's (0x800405fb).
    assert set(capability_names(0xA80425FB)) - set(capability_names(0x800405FB)) == {
        "AUDIT_WRITE",
        "MKNOD",
        "NET_RAW",
    }


def test_a_foreign_cache_key_names_its_fields() -> None:
    other = _cache_key().replace(engine_version="9.9.9")
    (line,) = differences(cpu_key(), cpu_key(cache_key=other))
    assert "engine_version" in line and "9.9.9 here" in line


def test_flags_in_another_order_are_the_same_key() -> None:
    assert cpu_key(cpu_flags="avx512f sse avx2") == cpu_key()


@pytest.mark.parametrize(
    "text",
    ["kb1:engine=vllm", "ks1:image=sha256:00", "ks1:" + "x=1;" * 3, "ks1:image=a;image=b"],
)
def test_bad_key_strings_are_refused_with_the_input(text: str) -> None:
    with pytest.raises(InvalidSnapshot):
        parse_snapshot_key(text)


def test_a_bad_field_is_refused_when_built() -> None:
    with pytest.raises(InvalidSnapshot, match="image="):
        cpu_key(image="latest")
    with pytest.raises(InvalidSnapshot, match="kernel="):
        cpu_key(kernel="")


def _manifest(**changes: object) -> SnapshotManifest:
    kw: dict[str, object] = {
        "key": cpu_key(),
        "files": (SnapshotFile(path="images/pages-1.img", size=3, sha256="c" * 64),),
        "tree": ((7, "python3 -m vllm"),),
        "health_port": 8000,
        "health_path": "/health",
        "deadline_s": 10.0,
        "taken": {"dump_s": 1.5},
    }
    kw.update(changes)
    return SnapshotManifest(**kw)  # type: ignore[arg-type]


def test_manifest_round_trips_and_its_digest_names_it() -> None:
    m = _manifest()
    again = SnapshotManifest.from_json(m.to_json(), source="t")
    assert again == m and again.digest == m.digest
    assert _manifest(deadline_s=11.0).digest != m.digest
    gpu = _manifest(tree=((7, "python3 -m vllm"), (9, "VLLM::EngineCore")), gpu_pids=(9,))
    assert SnapshotManifest.from_json(gpu.to_json(), source="t").gpu_pids == (9,)
    assert gpu.digest != _manifest(tree=gpu.tree).digest


def test_a_byte_count_in_taken_reads_back_as_the_same_bytes() -> None:
    # take records counts (room_need_bytes) beside seconds; an int written as 3541467168 and
    # read back as 3541467168.0 once made the manifest read differ from the file admission
    # pinned, so every restore of an H100 run fell back to the baked start.
    m = _manifest(taken={"room_need_bytes": 3_541_467_168, "dump_s": 2})
    text = m.to_json()
    again = SnapshotManifest.from_json(text, source="t")
    assert again.to_json() == text and again.digest == m.digest
    assert again.taken == {"dump_s": 2.0, "room_need_bytes": 3_541_467_168.0}


@pytest.mark.parametrize("gpu_pids", [(8,), (7, 7)])
def test_checkpointed_pids_must_be_distinct_pids_of_the_tree(gpu_pids: tuple[int, ...]) -> None:
    """The restore gives device state back to these pids: one outside the tree, or twice, is
    not a manifest take writes."""
    with pytest.raises(InvalidSnapshot, match="gpu_pids"):
        _manifest(gpu_pids=gpu_pids)


def test_a_manifest_without_its_checkpointed_pids_is_refused() -> None:
    """Read fail closed: a manifest that does not say which processes hold device state is
    not guessed at (every pid, or none)."""
    text = _manifest().to_json().replace('"gpu_pids": [],', "")
    assert "gpu_pids" not in text
    with pytest.raises(InvalidSnapshot, match="gpu_pids"):
        SnapshotManifest.from_json(text, source="snapshot.json")


@pytest.mark.parametrize(
    "files",
    [
        (),
        (SnapshotFile(path="../etc/passwd", size=1, sha256="c" * 64),),
        (SnapshotFile(path="pages-1.img", size=1, sha256="c" * 64),),
        (SnapshotFile(path="images/a", size=1, sha256="nothex"),),
    ],
)
def test_unsafe_or_empty_file_lists_are_refused(files: tuple[SnapshotFile, ...]) -> None:
    with pytest.raises(InvalidSnapshot):
        _manifest(files=files)


def test_a_manifest_whose_key_digest_was_edited_is_refused() -> None:
    text = _manifest().to_json().replace(cpu_key().digest, "sha256:" + "0" * 64)
    with pytest.raises(InvalidSnapshot, match="key_digest"):
        SnapshotManifest.from_json(text, source="snapshot.json")


@pytest.mark.parametrize("text", ["", "[]", "{}", '{"schema": 1}', "{" * 10, "[" * 200_000 + "]" * 200_000])
def test_junk_manifests_are_refused_without_a_traceback(text: str) -> None:
    with pytest.raises(InvalidSnapshot, match=r"snapshot\.json"):
        SnapshotManifest.from_json(text, source="snapshot.json")


def test_the_recorded_environment_round_trips_and_must_be_the_keys() -> None:
    m = _manifest(environment={"A": "1"})
    again = SnapshotManifest.from_json(m.to_json(), source="t")
    assert again.environment == {"A": "1"} and again.digest == m.digest != _manifest().digest
    with pytest.raises(InvalidSnapshot, match="does not digest to the key's serve_env"):
        _manifest(environment={"A": "2"})
    text = m.to_json().replace('"A": "1"', '"A": 1')
    with pytest.raises(InvalidSnapshot, match="environment must map names to string values"):
        SnapshotManifest.from_json(text, source="t")


def test_what_each_pod_or_node_sets_is_not_in_the_key() -> None:
    from kernelbake.contract.snapshot import is_volatile

    for name in (
        "HOSTNAME",
        "KUBERNETES_SERVICE_HOST",
        "KUBERNETES_PORT_443_TCP_ADDR",
        "NVIDIA_VISIBLE_DEVICES",
    ):
        assert is_volatile(name), name
    for name in ("VLLM_LOGGING_LEVEL", "KUBERNETES", "CUDA_VISIBLE_DEVICES", "KERNELBAKE_CACHE"):
        assert not is_volatile(name), name


def test_a_snapshot_files_kind_is_read_from_its_path() -> None:
    from kernelbake.contract.snapshot import FileKind, file_kind

    assert file_kind("images/pages-3.img") is FileKind.PAGES
    assert file_kind("images/dev-shm/psm_1") is FileKind.DEV_SHM
    # A weights part named like a page file is still the weights: the folder decides first.
    assert file_kind("images/weights/rank-0/pages-0.bin") is FileKind.WEIGHTS
    assert file_kind("images/inventory.img") is FileKind.OTHER
