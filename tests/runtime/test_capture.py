"""``capture collect`` in a replica and the delta at the next start (issue 36 items 1, 2, 4):
what a start compiled is captured; the next start merges it only when delta.json is pinned,
its key and base are this image's, no file would replace a baked one and every sha256
matches, and otherwise starts from the baked caches alone, saying why, with nothing copied."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.contract.delta import DELTA_MANIFEST
from kernelbake.contract.layout import CacheKind, kind_dir
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput
from kernelbake.runtime import trusted
from kernelbake.runtime.bundle import read_manifest
from kernelbake.runtime.capture.collect import collect
from kernelbake.runtime.compile.stage import run_compile
from kernelbake.runtime.engines.vllm import evidence
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.runtime.serve import preflight as pf
from tests.support.fake_engine import FakeEngine, pin_manifest, platform_for
from tests.support.runtime_target import runtime_env, write_target

NEW = "inductor/fxgraph/ab/fkey1/entry"
NEW_TRITON = "triton/tkey1/kernel.cubin"


class ClassEngine(FakeEngine):
    """Serves one request class the warm-up did not cover: the first time, it compiles a kernel
    for it (writes NEW), when the caches lack it; then it says it is ready."""

    def serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        code = (
            "import os, pathlib; p = pathlib.Path(os.environ['FAKE_CACHE_DIR']) / 'fxgraph/ab/fkey1/entry';"
            "p.exists() or (p.parent.mkdir(parents=True, exist_ok=True), p.write_bytes(b'compiled'));"
            "print('Application startup complete.', flush=True)"
        )
        return [sys.executable, "-c", code]

    def serve_watcher(self, cache_root: Path) -> evidence.Watcher:  # type: ignore[override]
        dirs = evidence.cache_dirs(cache_root, self.declaration.cache_kinds)
        return evidence.watcher(dirs, evidence.manifest_digests(cache_root, dirs))


@pytest.fixture
def target(tmp_path: Path) -> TargetConfig:
    return write_target(tmp_path, "tiny-llama.yaml")


@pytest.fixture
def engine(tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch) -> ClassEngine:
    engine = ClassEngine(platform_for(target.key))
    run_compile(runtime_env(tmp_path), engine=engine)
    pin_manifest(tmp_path / "target.json")
    monkeypatch.setattr("kernelbake.runtime.engines.get_engine", lambda _e: engine)
    monkeypatch.setattr(pf, "get_engine", lambda _e: engine)
    return engine


def _gain(root: Path) -> None:
    """What a replica's start-up and requests compiled into its caches."""
    for rel, data in ((NEW, b"compiled"), (NEW_TRITON, b"cubin")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def _fresh(root: Path) -> None:
    """The next replica: the image's caches as baked (what the replica gained is gone)."""
    shutil.rmtree(root / "inductor" / "fxgraph", ignore_errors=True)
    shutil.rmtree(root / "triton" / "tkey1", ignore_errors=True)


def _captured(tmp_path: Path, target: TargetConfig) -> Path:
    root = Path(target.cache_root)
    _gain(root)
    out = tmp_path / "captured"
    done = collect(runtime_env(tmp_path), out, replica="replica-0")
    assert done.out == out and {f.path for f in done.delta.files} == {NEW, NEW_TRITON}
    _fresh(root)
    # Mounted where the runtime looks (beside target.json under $KERNELBAKE_UNSAFE_TARGET).
    shutil.copytree(out, tmp_path / "delta")
    return tmp_path / "delta"


def _pinned_env(tmp_path: Path, **environ: str) -> RuntimeEnv:
    data = (tmp_path / "delta" / DELTA_MANIFEST).read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    return runtime_env(tmp_path, KERNELBAKE_DELTA_DIGEST=digest, **environ)


def _rewrite(delta: Path, edit: dict[str, object]) -> None:
    doc = json.loads((delta / DELTA_MANIFEST).read_text())
    doc.update(edit)
    (delta / DELTA_MANIFEST).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def test_collect_lists_what_the_caches_gained_with_the_engines_keys(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    root = Path(target.cache_root)
    _gain(root)
    out = tmp_path / "out"
    done = collect(runtime_env(tmp_path), out, replica="r0")
    doc = json.loads((out / DELTA_MANIFEST).read_text())
    assert doc["kinds"]["inductor"]["engine_keys"] == ["fkey1"]
    assert doc["kinds"]["triton"]["engine_keys"] == ["tkey1"]
    assert doc["key"] == str(target.key) and doc["base"]["image"] is None
    baked = (tmp_path / "pinned-manifest.json").read_bytes()
    assert doc["base"]["manifest"] == "sha256:" + hashlib.sha256(baked).hexdigest()
    assert (out / NEW).read_bytes() == b"compiled" and done.refused == ()
    # Nothing baked is in it.
    assert not {f.path for f in read_manifest(root).files} & {f.path for f in done.delta.files}


def test_collect_refuses_links_strays_and_changed_baked_files_and_captures_the_rest(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    root = Path(target.cache_root)
    _gain(root)
    baked = read_manifest(root).files[0].path
    (root / baked).write_bytes(b"other bytes")
    (root / "inductor" / "link").symlink_to("/etc/passwd")
    (root / "stray").mkdir()
    (root / "stray" / "x").write_bytes(b"x")
    done = collect(runtime_env(tmp_path), tmp_path / "out")
    assert {f.path for f in done.delta.files} == {NEW, NEW_TRITON}
    why = "\n".join(done.refused)
    assert f"{baked}: a baked file whose bytes changed" in why
    assert "inductor/link: a symlink" in why and "stray/: not a cache kind's directory" in why


def test_collect_writes_nothing_when_nothing_is_new_and_never_into_a_used_directory(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    done = collect(runtime_env(tmp_path), tmp_path / "out")
    assert done.out is None and not (tmp_path / "out").exists()
    assert "nothing to capture" in done.lines()[0]
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep").write_text("mine")
    _gain(Path(target.cache_root))
    with pytest.raises(BadInput, match="not an empty directory"):
        collect(runtime_env(tmp_path), used)
    assert sorted(p.name for p in used.iterdir()) == ["keep"]


def test_a_verified_delta_is_merged_before_the_engine_starts(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    _captured(tmp_path, target)
    v = pf.preflight(_pinned_env(tmp_path), engine=engine)
    assert v.warm and v.delta is not None and v.delta.used and v.delta.verified
    assert v.delta.files == 2
    assert (Path(target.cache_root) / NEW).read_bytes() == b"compiled"
    assert v.to_json()["delta"]["verified"] is True
    assert any("cache delta sha256:" in line and "merged" in line for line in v.lines())


def test_serve_compiles_the_class_once_and_the_next_replica_with_the_delta_compiles_nothing(
    tmp_path: Path,
    target: TargetConfig,
    engine: ClassEngine,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KERNELBAKE_UNSAFE_TARGET", str(tmp_path / "target.json"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    assert main(["serve"]) == 0
    assert "new files in inductor 1" in capfd.readouterr().err
    assert main(["capture", "collect", "--out", str(tmp_path / "captured"), "--replica", "r0"]) == 0
    assert "captured 1 new files" in capfd.readouterr().out
    _fresh(Path(target.cache_root))
    shutil.copytree(tmp_path / "captured", tmp_path / "delta")
    data = (tmp_path / "delta" / DELTA_MANIFEST).read_bytes()
    monkeypatch.setenv("KERNELBAKE_DELTA_DIGEST", "sha256:" + hashlib.sha256(data).hexdigest())
    assert main(["serve"]) == 0
    err = capfd.readouterr().err
    assert "merged into the caches (UNSAFE: the bytes a replica wrote, not rebuilt" in err
    assert "): 1 files" in err
    assert "start-up compiled nothing: 0 new files in inductor, triton" in err


def test_a_restart_finds_the_merged_delta_and_stays_warm(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    # A container restarted on the same writable cache root (an emptyDir survives it): the
    # delta's files are there from its first start, checked again against delta.json.
    _captured(tmp_path, target)
    assert pf.preflight(_pinned_env(tmp_path), engine=engine).delta.used  # type: ignore[union-attr]
    again = pf.preflight(_pinned_env(tmp_path), engine=engine)
    assert again.warm and again.problems == (), again.problems
    assert again.delta is not None and again.delta.used and again.delta.verified
    assert again.cache_root == Path(target.cache_root)


def test_a_restart_with_merged_files_changed_or_no_delta_pinned_goes_cold(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    _captured(tmp_path, target)
    root = Path(target.cache_root)
    assert pf.preflight(_pinned_env(tmp_path), engine=engine).delta.used  # type: ignore[union-attr]
    # The pod no longer pins the delta: what the first start merged is unvouched for.
    unpinned = pf.preflight(runtime_env(tmp_path), engine=engine)
    assert not unpinned.warm and any(NEW in p for p in unpinned.problems), unpinned.problems
    # Pinned, but a merged file was changed in the cache root since: the delta refuses it, and
    # the start does not open a cache beside it.
    (root / NEW).write_bytes(b"planted")
    changed = pf.preflight(_pinned_env(tmp_path), engine=engine)
    assert changed.delta is not None and not changed.delta.used
    assert not changed.warm and Path(changed.cache_root) != root
    assert any(NEW in p and "not used this time" in p for p in changed.problems), changed.problems


def _refused(tmp_path: Path, engine: ClassEngine, env: RuntimeEnv, why: str) -> None:
    v = pf.preflight(env, engine=engine)
    assert v.warm, "a refused delta leaves the baked caches in use"
    assert v.delta is not None and not v.delta.used and not v.delta.verified
    assert why in v.delta.reason
    assert "starting from the baked caches alone" in v.delta.line()
    root = Path(v.cache_root)
    assert not (root / NEW).exists() and not (root / NEW_TRITON).exists(), "nothing was copied"
    assert pf.preflight(runtime_env(tmp_path), engine=engine).warm, "the baked caches are intact"


def test_a_tampered_file_is_refused(tmp_path: Path, target: TargetConfig, engine: ClassEngine) -> None:
    delta = _captured(tmp_path, target)
    (delta / NEW_TRITON).write_bytes(b"CUBIN")
    _refused(tmp_path, engine, _pinned_env(tmp_path), f"{NEW_TRITON}: sha256")


def test_a_delta_nothing_pins_or_pinned_otherwise_is_refused(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    _captured(tmp_path, target)
    _refused(tmp_path, engine, runtime_env(tmp_path), "nothing pins the delta")
    other = "sha256:" + "0" * 64
    _refused(tmp_path, engine, runtime_env(tmp_path, KERNELBAKE_DELTA_DIGEST=other), f"pins {other}")


def test_a_foreign_key_is_refused(tmp_path: Path, target: TargetConfig, engine: ClassEngine) -> None:
    delta = _captured(tmp_path, target)
    _rewrite(delta, {"key": str(target.key.replace(model="other/model"))})
    _refused(tmp_path, engine, _pinned_env(tmp_path), "the delta is for key")


def test_a_base_that_does_not_match_is_refused(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    delta = _captured(tmp_path, target)
    _rewrite(delta, {"base": {"image": None, "manifest": "sha256:" + "1" * 64}})
    _refused(tmp_path, engine, _pinned_env(tmp_path), "this image pins")


def test_a_delta_that_would_overwrite_a_baked_file_is_refused(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    delta = _captured(tmp_path, target)
    baked = read_manifest(Path(target.cache_root)).files[0]
    (delta / baked.path).parent.mkdir(parents=True, exist_ok=True)
    (delta / baked.path).write_bytes(b"evil")
    doc = json.loads((delta / DELTA_MANIFEST).read_text())
    doc["kinds"]["inductor"]["files"].append(
        {"path": baked.path, "size": 4, "sha256": hashlib.sha256(b"evil").hexdigest()}
    )
    _rewrite(delta, {"kinds": doc["kinds"]})
    _refused(tmp_path, engine, _pinned_env(tmp_path), "would replace baked files")
    assert (Path(target.cache_root) / baked.path).read_bytes() != b"evil"


@pytest.mark.parametrize(
    ("path", "why"),
    [("inductor/../../escape", "leaves the cache root"), ("triton", "not under its kind's directory")],
)
def test_unsafe_paths_and_foreign_kinds_are_refused(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine, path: str, why: str
) -> None:
    delta = _captured(tmp_path, target)
    doc = json.loads((delta / DELTA_MANIFEST).read_text())
    doc["kinds"]["triton"]["files"].append({"path": path, "size": 1, "sha256": "a" * 64})
    _rewrite(delta, {"kinds": doc["kinds"]})
    _refused(tmp_path, engine, _pinned_env(tmp_path), why)
    doc["kinds"]["triton"]["files"].pop()
    doc["kinds"]["vllm"] = {"files": [{"path": "vllm/x/y", "size": 1, "sha256": "a" * 64}]}
    _rewrite(delta, {"kinds": doc["kinds"]})
    _refused(tmp_path, engine, _pinned_env(tmp_path), "kinds this engine does not cache: vllm")


def test_a_cold_start_does_not_use_the_delta(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    _captured(tmp_path, target)
    v = pf.preflight(_pinned_env(tmp_path, KERNELBAKE_CACHE="off"), engine=engine)
    assert not v.warm and v.delta is not None and not v.delta.used
    assert "neither is the delta" in v.delta.reason
    assert not (Path(v.cache_root) / NEW).exists()


def test_a_delta_is_judged_before_the_engine_starts_not_beside_it(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    assert pf.speculate(runtime_env(tmp_path), engine=engine) is not None
    _captured(tmp_path, target)
    # Mounted, pinned or not: the preflight merges it (or says why not) before the engine starts.
    assert pf.speculate(runtime_env(tmp_path), engine=engine) is None
    assert pf.speculate(_pinned_env(tmp_path), engine=engine) is None
    assert not (kind_dir(Path(target.cache_root), CacheKind.INDUCTOR) / "fxgraph").exists()


# -- issue 41, item 3: what serve merges comes from the delta's own mount ----------------------


def _planted(tmp_path: Path, target: TargetConfig) -> RuntimeEnv:
    """The break: a signed delta at DELTA_ROOT, and a pod that mounted its own delta.json and
    kernel over it by subPath and pinned that delta.json (the last of two entries, the one
    Kubernetes keeps). Every sha256 matches the planted delta.json, which nobody signed."""
    delta = _captured(tmp_path, target)
    (delta / NEW_TRITON).write_bytes(b"planted kernel")
    doc = json.loads((delta / DELTA_MANIFEST).read_text())
    for f in doc["kinds"]["triton"]["files"]:
        if f["path"] == NEW_TRITON:
            f.update(size=len(b"planted kernel"), sha256=hashlib.sha256(b"planted kernel").hexdigest())
    _rewrite(delta, {"kinds": doc["kinds"]})
    return _pinned_env(tmp_path)


def _mounted_over(monkeypatch: pytest.MonkeyPatch, *paths: Path) -> None:
    lines = "".join(f"{70 + i} 27 254:0 /planted/{i} {p} ro - ext4 x ro\n" for i, p in enumerate(paths))
    monkeypatch.setattr(trusted, "_mountinfo", lambda: "26 1 0:5 / / rw - overlay overlay rw\n" + lines)


def test_files_mounted_inside_the_delta_root_are_not_merged_whatever_pins_them(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _planted(tmp_path, target)
    _mounted_over(monkeypatch, tmp_path / "delta" / DELTA_MANIFEST, tmp_path / "delta" / NEW_TRITON)
    _refused(
        tmp_path,
        engine,
        env,
        f"{tmp_path / 'delta' / DELTA_MANIFEST} is a mount point ({trusted.MOUNTINFO}) inside the delta",
    )
    assert (Path(target.cache_root) / NEW_TRITON).exists() is False


def test_the_delta_root_itself_being_a_mount_is_the_recipe(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image volume at DELTA_ROOT is a mount point itself: that one is the delta's own."""
    _captured(tmp_path, target)
    _mounted_over(monkeypatch, tmp_path / "delta", tmp_path / "delta-other")
    v = pf.preflight(_pinned_env(tmp_path), engine=engine)
    assert v.delta is not None and v.delta.used, v.delta


def test_an_unreadable_mount_table_leaves_the_delta_unused(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _captured(tmp_path, target)

    def gone() -> str:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(trusted, "_mountinfo", gone)
    _refused(tmp_path, engine, _pinned_env(tmp_path), "cannot be read (Permission denied)")
