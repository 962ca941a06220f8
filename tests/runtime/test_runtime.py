"""The compile step and the runtime preflight, with a fake engine and a temporary cache root."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import threading
from pathlib import Path

import pytest

from kernelbake.contract.layout import CacheKind, kind_dir
from kernelbake.contract.platform import Platform
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput, BuildFailed, EnvironmentProblem, KeyMismatch
from kernelbake.plan import plan
from kernelbake.render import target_config
from kernelbake.runtime import integrity
from kernelbake.runtime.bundle import FileEntry, read_manifest
from kernelbake.runtime.compile.stage import run_compile
from kernelbake.runtime.engines import CompileResult
from kernelbake.runtime.env import SNAPSHOT_TAKE_ENV, VerifyMode
from kernelbake.runtime.serve import preflight as pf
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.support.fake_engine import FakeEngine, pin_manifest, platform_for
from tests.support.runtime_target import runtime_env as _env
from tests.support.runtime_target import write_target


@pytest.fixture
def target(tmp_path: Path) -> TargetConfig:
    return write_target(tmp_path, "tiny-llama-torch.yaml")


def _unsafe_target_note(tmp_path: Path) -> str:
    return (
        f"UNSAFE: $KERNELBAKE_UNSAFE_TARGET moved target.json and the pinned manifest to {tmp_path}; nothing "
        "checks that they are the image's (mounts, owner), so whoever wrote them there decides which caches "
        "start warm"
    )


def _baked(tmp_path: Path, target: TargetConfig) -> Path:
    run_compile(_env(tmp_path, KERNELBAKE_BUILDER="test-host"), engine=FakeEngine(platform_for(target.key)))
    pin_manifest(tmp_path / "target.json")
    return Path(target.cache_root)


# -- compile ---------------------------------------------------------------------------------


def test_compile_writes_the_bundle_with_a_builder_entry(tmp_path: Path, target: TargetConfig) -> None:
    root = _baked(tmp_path, target)
    manifest = read_manifest(root)
    assert manifest.key == target.key
    assert manifest.totals() == {"inductor": {"files": 2, "bytes": 201}}
    report = dict(manifest.compile_report)
    assert report["builder"] == {
        "device": "cpu",
        "driver": "none",
        "arch": "x86_64",
        "cuda": "none",
        "host": "test-host",
    }
    assert report["graphs"] == 2
    assert dict(manifest.hashed_env) == {"FAKE_HASHED": "1"}
    # Every declared kind has its directory, even when empty: the final stage COPYs each.
    assert (root / "triton").is_dir()


class _LoggingEngine(FakeEngine):
    """Writes a log into its cache directory, as FlashInfer does, besides its caches."""

    def compile(self, target: TargetConfig, root: Path) -> CompileResult:
        result = super().compile(target, root)
        (kind_dir(root, CacheKind.INDUCTOR) / "engine_jit.log").write_text("started\n")
        return dataclasses.replace(result, logs=frozenset({"engine_jit.log"}))


def test_a_log_the_engine_appends_to_is_no_cache_and_a_second_start_stays_warm(
    tmp_path: Path, target: TargetConfig
) -> None:
    engine = _LoggingEngine(platform_for(target.key))
    run_compile(_env(tmp_path, KERNELBAKE_BUILDER="test-host"), engine=engine)
    pin_manifest(tmp_path / "target.json")
    root = Path(target.cache_root)
    log = kind_dir(root, CacheKind.INDUCTOR) / "engine_jit.log"
    assert log.is_file()  # still in the bundle: a start finds it and adds no file
    assert "inductor/engine_jit.log" not in {f.path for f in read_manifest(root).files}
    assert pf.preflight(_env(tmp_path), engine=engine).warm
    with log.open("a") as fh:  # the first start's line
        fh.write("started again\n")
    assert pf.preflight(_env(tmp_path), engine=engine).warm
    # A cache file that changes still starts cold.
    graph = kind_dir(root, CacheKind.INDUCTOR) / "g0" / "graph.bin"
    graph.write_bytes(graph.read_bytes() + b"x")
    assert not pf.preflight(_env(tmp_path), engine=engine).warm


def test_compile_refuses_a_builder_that_differs_from_the_plan(tmp_path: Path, target: TargetConfig) -> None:
    engine = FakeEngine(platform_for(target.key, torch="2.12.0", python="3.12"))
    with pytest.raises(KeyMismatch) as info:
        run_compile(_env(tmp_path), engine=engine)
    assert "torch: baked '2.13.0', found '2.12.0'" in str(info.value)
    assert "python: baked '3.11', found '3.12'" in str(info.value)
    assert engine.compiled_into is None
    assert not (Path(target.cache_root) / "manifest.json").exists()


def test_compile_refuses_a_gpu_builder_below_the_driver_floor(tmp_path: Path) -> None:
    (t,) = plan(load_spec(REPO / "images" / "qwen3-8b.yaml"), ["h100"])
    config = dataclasses.replace(target_config(t), cache_root=str(tmp_path / "cache"))
    (tmp_path / "target.json").write_text(config.to_json())
    with pytest.raises(KeyMismatch, match=re.escape("driver_floor: baked '580.65.06', found '535.104.05'")):
        run_compile(_env(tmp_path), engine=FakeEngine(platform_for(t.key, driver="535.104.05")))
    with pytest.raises(KeyMismatch, match="device: baked 'NVIDIA H100 80GB HBM3', found 'NVIDIA H100 PCIe'"):
        run_compile(_env(tmp_path), engine=FakeEngine(platform_for(t.key, device="NVIDIA H100 PCIe")))


def test_compile_refuses_leftover_files_and_empty_output(tmp_path: Path, target: TargetConfig) -> None:
    with pytest.raises(BuildFailed, match="left no cache files"):
        run_compile(_env(tmp_path), engine=FakeEngine(platform_for(target.key), files=0))
    stale = Path(target.cache_root) / "inductor" / "old.bin"
    stale.write_bytes(b"x")
    with pytest.raises(BuildFailed, match="refusing to bake caches that this compile did not produce"):
        run_compile(_env(tmp_path), engine=FakeEngine(platform_for(target.key)))


# -- preflight ------------------------------------------------------------------------------


def test_exact_match_starts_warm_on_the_baked_caches(tmp_path: Path, target: TargetConfig) -> None:
    root = _baked(tmp_path, target)
    v = pf.preflight(_env(tmp_path), engine=FakeEngine(platform_for(target.key)))
    # Outside an image the trusted files are moved by the unsafe variable, and only that is said.
    assert v.warm and v.problems == () and v.notes == (_unsafe_target_note(tmp_path),)
    assert v.cache_root == root
    assert v.env["FAKE_CACHE_DIR"] == str(root / "inductor")
    assert v.manifest_files == 2


class _FastStartEngine(FakeEngine):
    def launch_env(self) -> dict[str, str]:
        return {"FAKE_START": "fork", "FAKE_CACHE_DIR": "/not/the/bundle"}


def test_launch_env_reaches_the_engine_and_the_image_env_wins(tmp_path: Path, target: TargetConfig) -> None:
    root = _baked(tmp_path, target)
    engine = _FastStartEngine(platform_for(target.key))
    v = pf.preflight(_env(tmp_path), engine=engine)
    assert v.warm
    assert v.env["FAKE_START"] == "fork"
    # The cache variables are kernelbake's, whatever a launch default says.
    assert v.env["FAKE_CACHE_DIR"] == str(root / "inductor")
    v = pf.preflight(_env(tmp_path, FAKE_START="spawn"), engine=engine)
    assert v.env["FAKE_START"] == "spawn"


class _SnapshotEngine(_FastStartEngine):
    def snapshot_env(self) -> dict[str, str]:
        return {"FAKE_START": "spawn"}


@pytest.mark.parametrize(("taking", "want"), [("1", "spawn"), ("", "fork")])
def test_a_tree_snapshot_take_starts_gets_the_engines_snapshot_env_over_the_images(
    tmp_path: Path, target: TargetConfig, taking: str, want: str
) -> None:
    """``snapshot take`` starts serve with SNAPSHOT_TAKE_ENV: the engine's snapshot variables
    then win even over the image's environment (a forked vLLM engine core would hold the API
    server's NVML files); any other serve keeps its launch default."""
    _baked(tmp_path, target)
    engine = _SnapshotEngine(platform_for(target.key))
    v = pf.preflight(_env(tmp_path, FAKE_START="fork", **{SNAPSHOT_TAKE_ENV: taking}), engine=engine)
    assert v.warm
    assert v.env["FAKE_START"] == want


class _HashedLaunchEngine(FakeEngine):
    declaration = dataclasses.replace(
        FakeEngine.declaration, cache_variables=(("FAKE_CACHE_DIR", CacheKind.INDUCTOR),)
    )

    def launch_env(self) -> dict[str, str]:
        return {"FAKE_HASHED": "2"}


def test_a_launch_default_the_engine_hashes_is_named(tmp_path: Path, target: TargetConfig) -> None:
    """Were an engine to hash one of its launch defaults, the start would miss the caches:
    the preflight compares what the engine will see, defaults included."""
    _baked(tmp_path, target)
    v = pf.preflight(_env(tmp_path), engine=_HashedLaunchEngine(platform_for(target.key)))
    assert v.warm
    assert v.notes[0].startswith("$FAKE_HASHED is '2' but was '1' at compile time")
    v = pf.preflight(_env(tmp_path, FAKE_HASHED="1"), engine=_HashedLaunchEngine(platform_for(target.key)))
    assert v.notes == (_unsafe_target_note(tmp_path),)


def test_mismatch_starts_cold_in_a_fresh_directory_with_reasons(tmp_path: Path, target: TargetConfig) -> None:
    root = _baked(tmp_path, target)
    v = pf.preflight(_env(tmp_path), engine=FakeEngine(platform_for(target.key, torch="2.12.0")))
    assert not v.warm
    assert v.problems == (
        "torch: baked '2.13.0', found '2.12.0' (Inductor caches are keyed by the torch version)",
    )
    assert v.cache_root != root and v.cache_root.parent == tmp_path / "scratch"
    assert list(v.cache_root.rglob("*.bin")) == []
    assert v.env["FAKE_CACHE_DIR"].startswith(str(tmp_path / "scratch"))
    assert "WARNING: starting COLD" in v.lines()[0]


def _flip_one_byte(path: Path) -> tuple[str, str]:
    """Flip one bit of one byte in place (same size); returns the sha256 before and after."""
    data = bytearray(path.read_bytes())
    before = hashlib.sha256(data).hexdigest()
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return before, hashlib.sha256(data).hexdigest()


def test_a_flipped_byte_starts_cold_naming_the_file_and_both_digests(
    tmp_path: Path, target: TargetConfig
) -> None:
    root = _baked(tmp_path, target)
    recorded, found = _flip_one_byte(root / "inductor" / "g0" / "graph.bin")
    v = pf.preflight(_env(tmp_path), engine=FakeEngine(platform_for(target.key)))
    assert v.problems == (
        f"cache integrity: inductor/g0/graph.bin: sha256 {found} but the manifest records {recorded}",
    )
    assert v.cache_root != root and v.env["FAKE_CACHE_DIR"].startswith(str(tmp_path / "scratch"))
    assert list(v.cache_root.rglob("*.bin")) == []
    assert v.to_json()["verify"] == "sha256"


def test_size_only_is_unsafe_by_name_and_says_so(tmp_path: Path, target: TargetConfig) -> None:
    root = _baked(tmp_path, target)
    _flip_one_byte(root / "inductor" / "g0" / "graph.bin")
    v = pf.preflight(
        _env(tmp_path, KERNELBAKE_VERIFY="unsafe-size-only"), engine=FakeEngine(platform_for(target.key))
    )
    assert v.warm and v.cache_root == root
    assert v.notes[0].startswith("UNSAFE: KERNELBAKE_VERIFY=unsafe-size-only compares cache file sizes only")
    assert "sizes only (UNSAFE)" in v.lines()[0] and "WARNING: UNSAFE" in v.lines()[1]
    assert v.to_json()["verify"] == "unsafe-size-only"


def test_verify_mode_names(tmp_path: Path) -> None:
    assert _env(tmp_path).verify is VerifyMode.SHA256
    assert _env(tmp_path, KERNELBAKE_VERIFY="deep").verify is VerifyMode.SHA256
    with pytest.raises(BadInput, match="the size-only check is now 'unsafe-size-only'"):
        _env(tmp_path, KERNELBAKE_VERIFY="size")
    with pytest.raises(BadInput, match="expected one of sha256, unsafe-size-only"):
        _env(tmp_path, KERNELBAKE_VERIFY="fast")


def test_missing_resized_or_unreadable_files_start_cold(tmp_path: Path, target: TargetConfig) -> None:
    root = _baked(tmp_path, target)
    (root / "inductor" / "g0" / "graph.bin").write_bytes(b"short")
    v = pf.preflight(_env(tmp_path), engine=FakeEngine(platform_for(target.key)))
    assert v.problems == ("cache integrity: inductor/g0/graph.bin: size 5 but the manifest records 100",)
    (root / "inductor" / "g1" / "graph.bin").unlink()
    v = pf.preflight(_env(tmp_path), engine=FakeEngine(platform_for(target.key)))
    assert v.problems[1] == "cache integrity: inductor/g1/graph.bin: missing"
    (root / "manifest.json").unlink()
    v = pf.preflight(_env(tmp_path), engine=FakeEngine(platform_for(target.key)))
    assert not v.warm and "cannot read cache manifest" in v.problems[0]


class _Probed(FakeEngine):
    """Counts its probes: speculation must not import the engine's libraries."""

    probes = 0

    def probe(self) -> Platform:
        type(self).probes += 1
        return super().probe()


def test_speculation_is_the_warm_verdicts_environment_without_a_probe_or_a_hash(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _baked(tmp_path, target)
    engine = _Probed(platform_for(target.key))
    hashed: list[str] = []
    real = integrity._digest_problem

    def digest(r: Path, e: FileEntry) -> str | None:
        hashed.append(e.path)
        return real(r, e)

    monkeypatch.setattr(integrity, "_digest_problem", digest)
    guess = pf.speculate(_env(tmp_path), engine)
    assert guess is not None and _Probed.probes == 0 and hashed == []
    assert guess.cache_root == root and guess.manifest_files == 2
    v = pf.preflight(_env(tmp_path), engine=engine)
    assert (
        v.warm
        and _Probed.probes == 1
        and sorted(hashed) == ["inductor/g0/graph.bin", "inductor/g1/graph.bin"]
    )
    # serve opens the gate only on this equality.
    assert (v.cache_root, v.env) == (guess.cache_root, guess.env)


def test_speculation_is_not_made_where_the_start_cannot_be_warm_in_place(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _baked(tmp_path, target)
    engine = FakeEngine(platform_for(target.key))
    assert pf.speculate(_env(tmp_path, KERNELBAKE_CACHE="off"), engine) is None
    real = pf._usable
    with monkeypatch.context() as m:
        m.setattr(pf, "_usable", lambda paths: root not in paths and real(paths))
        assert pf.speculate(_env(tmp_path), engine) is None
    doc = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(
        json.dumps({**doc, "key": str(target.key.replace(max_model_len=4096))})
    )
    assert pf.speculate(_env(tmp_path), engine) is None
    (root / "manifest.json").write_text("{")
    assert pf.speculate(_env(tmp_path), engine) is None
    # An unreadable target is the preflight's to report, with its file and line.
    assert (
        pf.speculate(_env(tmp_path, KERNELBAKE_UNSAFE_TARGET=str(tmp_path / "missing.json")), engine) is None
    )


def test_speculation_goes_ahead_of_a_platform_the_preflight_then_refuses(
    tmp_path: Path, target: TargetConfig
) -> None:
    """The probe is what the speculation skips: a machine the key does not fit is found by the
    preflight, which then starts cold somewhere else, and serve closes the gate."""
    root = _baked(tmp_path, target)
    engine = FakeEngine(platform_for(target.key, arch="sm_80", device="NVIDIA A100-SXM4-80GB"))
    guess = pf.speculate(_env(tmp_path), engine)
    assert guess is not None and guess.cache_root == root
    v = pf.preflight(_env(tmp_path), engine=engine)
    assert not v.warm and v.cache_root != root and v.env != guess.env


def test_preflight_waits_for_the_hashes_when_the_caches_must_be_copied(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _baked(tmp_path, target)
    _flip_one_byte(root / "inductor" / "g0" / "graph.bin")
    real = pf._usable
    monkeypatch.setattr(pf, "_usable", lambda paths: root not in paths and real(paths))
    v = pf.preflight(_env(tmp_path), engine=FakeEngine(platform_for(target.key)))
    assert not v.warm and "sha256" in v.problems[0]
    assert list(v.cache_root.rglob("*.bin")) == []


def test_manifest_for_another_key_starts_cold(tmp_path: Path, target: TargetConfig) -> None:
    root = _baked(tmp_path, target)
    doc = json.loads((root / "manifest.json").read_text())
    doc["key"] = str(target.key.replace(max_model_len=4096))
    (root / "manifest.json").write_text(json.dumps(doc))
    pin_manifest(tmp_path / "target.json")  # an image built for that key, cache and pin alike
    v = pf.preflight(_env(tmp_path), engine=FakeEngine(platform_for(target.key)))
    assert not v.warm and "the cache manifest was built for key" in v.problems[0]


def test_cache_off_starts_cold_on_purpose(tmp_path: Path, target: TargetConfig) -> None:
    _baked(tmp_path, target)
    v = pf.preflight(_env(tmp_path, KERNELBAKE_CACHE="off"), engine=FakeEngine(platform_for(target.key)))
    assert v.problems == ("KERNELBAKE_CACHE=off: starting cold on purpose",)


def test_changed_hashed_env_and_shape_args_warn_but_stay_warm(tmp_path: Path, target: TargetConfig) -> None:
    _baked(tmp_path, target)

    class Engine(FakeEngine):
        declaration = dataclasses.replace(
            FakeEngine.declaration, cache_variables=(("FAKE_CACHE_DIR", CacheKind.INDUCTOR),)
        )

    v = pf.preflight(
        _env(tmp_path, FAKE_HASHED="2"), ["--shapes", "4x64"], engine=Engine(platform_for(target.key))
    )
    assert v.warm
    assert v.notes[0].startswith("$FAKE_HASHED is '2' but was '1' at compile time")
    assert v.notes[1].startswith("serve arguments change what was compiled (--shapes changes the shapes)")


def test_read_only_root_copies_with_a_loud_warning(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _baked(tmp_path, target)
    real = pf._usable
    monkeypatch.setattr(pf, "_usable", lambda paths: root not in paths and real(paths))
    v = pf.preflight(_env(tmp_path), engine=FakeEngine(platform_for(target.key)))
    assert v.warm and v.cache_root != root
    assert (v.cache_root / "inductor" / "g1" / "graph.bin").read_bytes() == b"\x01" * 101
    assert "is read-only, so the caches were copied" in v.notes[0]
    assert "docker run --read-only -v" in v.notes[0]


def test_only_serve_time_changes_are_the_fallbacks_changes_whatever_a_notes_path_says(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The copy's warning names the cache root, here a path that says "compile": it is a
    # warning, not a serve-time change, so the start still predicts a hit.
    config = dataclasses.replace(target, cache_root=str(tmp_path / "compiled"))
    (tmp_path / "target.json").write_text(config.to_json())
    root = _baked(tmp_path, config)
    real = pf._usable
    monkeypatch.setattr(pf, "_usable", lambda paths: root not in paths and real(paths))
    v = pf.preflight(_env(tmp_path), engine=FakeEngine(platform_for(config.key)))
    assert v.warm and "compiled" in v.notes[0] and "is read-only" in v.notes[0]
    assert v.prediction is not None and v.prediction.hit and v.predicted_hit

    class Engine(FakeEngine):
        declaration = dataclasses.replace(
            FakeEngine.declaration, cache_variables=(("FAKE_CACHE_DIR", CacheKind.INDUCTOR),)
        )

    changed = pf.preflight(_env(tmp_path, FAKE_HASHED="2"), engine=Engine(platform_for(config.key)))
    assert changed.prediction is not None and not changed.prediction.hit
    assert [c.now for k in changed.prediction.kinds for c in k.changes] == [
        n for n in changed.notes if n.startswith("$FAKE_HASHED")
    ] * len(changed.prediction.kinds)


def test_no_usable_scratch_is_a_clear_error(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    _baked(tmp_path, target)
    monkeypatch.setattr(pf, "_usable", lambda paths: False)
    with pytest.raises(EnvironmentProblem, match="allows executing compiled kernels"):
        pf.preflight(_env(tmp_path), engine=FakeEngine(platform_for(target.key)))


def test_seed_copies_the_bundle(tmp_path: Path, target: TargetConfig) -> None:
    root = _baked(tmp_path, target)
    done = pf.seed(_env(tmp_path), tmp_path / "seed")
    assert (done.files, done.skipped, done.root) == (2, (), root)
    assert (tmp_path / "seed" / "manifest.json").read_bytes() == (root / "manifest.json").read_bytes()
    assert (tmp_path / "seed" / "inductor" / "g1" / "graph.bin").read_bytes() == b"\x01" * 101
    # The seeded copy is what a serving container then mounts at the cache root: warm, and in
    # place. Every kind directory of the image's cache root is there, those of kinds that
    # compiled nothing (triton here) included: serve keeps the caches in place only when it can
    # write into each, and otherwise copies them to scratch (deploy/examples/serve.yaml).
    assert (root / "triton").is_dir() and (tmp_path / "seed" / "triton").is_dir()
    seeded = dataclasses.replace(target, cache_root=str(tmp_path / "seed"))
    (tmp_path / "target.json").write_text(seeded.to_json())
    verdict = pf.preflight(_env(tmp_path), engine=FakeEngine(platform_for(target.key)))
    assert verdict.warm and verdict.cache_root == tmp_path / "seed", verdict.notes


def test_seed_keeps_each_files_mtime(tmp_path: Path, target: TargetConfig) -> None:
    # The init-container recipe promises a copy like ``cp -a``: a seeded cache reads as the
    # baked one, file times included.
    root = _baked(tmp_path, target)
    for i, p in enumerate(sorted(root.rglob("*"))):
        if p.is_file():
            os.utime(p, ns=(1_000_000_000 * (i + 1), 1_500_000_000_000_000_000 + i))
    pf.seed(_env(tmp_path), tmp_path / "seed")
    baked = {p.relative_to(root): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    seeded = {
        p.relative_to(tmp_path / "seed"): p.stat().st_mtime_ns
        for p in (tmp_path / "seed").rglob("*")
        if p.is_file()
    }
    assert seeded == baked


def test_seed_refuses_a_tampered_bundle(tmp_path: Path, target: TargetConfig) -> None:
    root = _baked(tmp_path, target)
    _flip_one_byte(root / "inductor" / "g0" / "graph.bin")
    with pytest.raises(
        BadInput, match=r"seed-cache: copying .*: inductor/g0/graph.bin: sha256 [0-9a-f]{64} \("
    ):
        pf.seed(_env(tmp_path), tmp_path / "seed")


def test_seed_follows_no_symlink_copies_no_stranger_and_counts_what_it_copied(
    tmp_path: Path, target: TargetConfig
) -> None:
    root = _baked(tmp_path, target)
    secret = tmp_path / "secret.txt"
    secret.write_text("not a cache")
    (root / "inductor" / "planted.so").write_bytes(b"unverified")
    (root / "inductor" / "link.so").symlink_to(secret)
    (root / "triton" / "elsewhere").symlink_to(tmp_path, target_is_directory=True)
    done = pf.seed(_env(tmp_path), tmp_path / "seed")
    assert done.files == 2
    assert sorted(done.skipped) == [
        "inductor/link.so: a symlink the manifest does not list",
        "inductor/planted.so: a file the manifest does not list",
        "triton/elsewhere: a symlink the manifest does not list",
    ]
    copied = sorted(p.relative_to(tmp_path / "seed").as_posix() for p in (tmp_path / "seed").rglob("*"))
    assert copied == [
        "inductor",
        "inductor/g0",
        "inductor/g0/graph.bin",
        "inductor/g1",
        "inductor/g1/graph.bin",
        "manifest.json",
        # The kind's directory, empty: its symlink is left behind.
        "triton",
    ]
    # A listed file that became a symlink (to a file of the same bytes, even) is not followed.
    graph = root / "inductor" / "g0" / "graph.bin"
    (tmp_path / "same.bin").write_bytes(graph.read_bytes())
    graph.unlink()
    graph.symlink_to(tmp_path / "same.bin")
    with pytest.raises(BadInput, match=r"inductor/g0/graph\.bin: cannot be copied"):
        pf.seed(_env(tmp_path), tmp_path / "seed2")


def test_a_broken_engine_is_one_line(tmp_path: Path, target: TargetConfig) -> None:
    class Broken(FakeEngine):
        def probe(self) -> Platform:
            raise ImportError("libtorch_cpu.so: cannot open shared object file")

    with pytest.raises(
        EnvironmentProblem, match="probing the torch engine failed: ImportError: libtorch_cpu"
    ):
        pf.preflight(_env(tmp_path), engine=Broken(platform_for(target.key)))


def test_fetch_model_downloads_config_files_at_the_pinned_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    import types

    from kernelbake.runtime.compile.fetch import fetch_model

    (t,) = plan(load_spec(REPO / "images" / "qwen3-8b.yaml"), ["h100"])
    key = t.key.replace(model_path=str(tmp_path / "models" / "qwen3-8b"))
    config = dataclasses.replace(target_config(t), key=key)
    (tmp_path / "target.json").write_text(config.to_json())
    calls: list[dict[str, object]] = []

    def snapshot_download(**kw: object) -> str:
        calls.append(kw)
        dest = Path(str(kw["local_dir"]))
        (dest / "config.json").write_text("{}")
        (dest / ".cache").mkdir()
        return str(dest)

    monkeypatch.setitem(
        sys.modules, "huggingface_hub", types.SimpleNamespace(snapshot_download=snapshot_download)
    )
    dest = fetch_model(_env(tmp_path, HF_TOKEN="hf_x"))
    assert dest == tmp_path / "models" / "qwen3-8b"
    (call,) = calls
    assert (
        call["repo_id"] == "Qwen/Qwen3-8B" and call["revision"] == "b968826d9c46dd6066d109eabc6255188de91218"
    )
    assert call["token"] == "hf_x"
    assert "*.safetensors" in call["ignore_patterns"]  # type: ignore[operator]
    assert not any("safetensors" in p for p in call["allow_patterns"])  # type: ignore[attr-defined]
    assert not (dest / ".cache").exists()


def test_check_reports_the_verification_and_refuses_a_flipped_byte(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kernelbake.cli import main

    root = _baked(tmp_path, target)
    engine = FakeEngine(platform_for(target.key))
    monkeypatch.setattr("kernelbake.runtime.serve.preflight.get_engine", lambda _engine: engine)
    monkeypatch.setenv("KERNELBAKE_UNSAFE_TARGET", str(tmp_path / "target.json"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    capsys.readouterr()
    assert main(["check", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verify"] == "sha256" and doc["integrity"].startswith(
        "2 files, sha256 of every file checked in"
    )
    recorded, found = _flip_one_byte(root / "inductor" / "g0" / "graph.bin")
    assert main(["check"]) == KeyMismatch.return_code
    out = capsys.readouterr().out
    assert (
        f"  - cache integrity: inductor/g0/graph.bin: sha256 {found} but the manifest records {recorded}"
        in out
    )
    assert main(["check", "--unsafe-size-only"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "HIT: nothing compiles at start (exit 0)"
    (details,) = [ln for ln in out if ln.startswith("  baked caches in use: ")]
    assert "2 files, sizes only (UNSAFE) checked in" in details
    assert out[out.index(details) + 1].startswith(
        "  WARNING: UNSAFE: KERNELBAKE_VERIFY=unsafe-size-only compares cache file sizes only"
    )


def test_the_hashing_time_stops_with_the_last_file_not_when_asked(
    tmp_path: Path, target: TargetConfig
) -> None:
    root = _baked(tmp_path, target)
    check = integrity.Check(root, read_manifest(root), hash_files=True)
    assert check.result() == []
    took = check.seconds
    threading.Event().wait(0.05)
    assert check.seconds == took
