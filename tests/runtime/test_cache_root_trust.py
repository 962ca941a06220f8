"""The runtime trusts only the manifest the image pins, reads only inside the cache root,
never crashes in ``check``, and bakes caches any uid can read (issue 20: items 5, 6, 8, 9)."""

from __future__ import annotations

import hashlib
import json
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.contract.artifact import MANIFEST_DIGEST_ENV
from kernelbake.contract.layout import CacheKind, kind_dir
from kernelbake.contract.manifest import Manifest
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput, EnvironmentProblem, KeyMismatch
from kernelbake.runtime.compile.stage import run_compile
from kernelbake.runtime.engines import CompileResult
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.runtime.prediction import Prediction
from kernelbake.runtime.serve import preflight as pf
from tests.support.fake_engine import FakeEngine, pin_manifest, platform_for
from tests.support.runtime_target import runtime_env as _env
from tests.support.runtime_target import write_target


@pytest.fixture
def target(tmp_path: Path) -> TargetConfig:
    return write_target(tmp_path, "tiny-llama-torch.yaml")


def _bake(
    tmp_path: Path, target: TargetConfig, engine: FakeEngine | None = None, *, pin: bool = True
) -> Path:
    run_compile(_env(tmp_path), engine=engine or FakeEngine(platform_for(target.key)))
    if pin:
        pin_manifest(tmp_path / "target.json")
    return Path(target.cache_root)


def _preflight(tmp_path: Path, target: TargetConfig, **environ: str) -> pf.Verdict:
    return pf.preflight(_env(tmp_path, **environ), engine=FakeEngine(platform_for(target.key)))


def _digest(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _swap_file_and_its_entry(root: Path) -> None:
    """What a writable cache volume or a derived image can do: change a cache file and write
    a manifest that matches it, so every file agrees with the manifest in the cache root."""
    graph = root / "inductor" / "g0" / "graph.bin"
    graph.write_bytes(b"\x66" * 100)
    doc = json.loads((root / "manifest.json").read_text())
    for f in doc["files"]:
        if f["path"] == "inductor/g0/graph.bin":
            f["sha256"] = hashlib.sha256(graph.read_bytes()).hexdigest()
    (root / "manifest.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


# -- 5: the manifest is bound to the image ------------------------------------------------


def test_a_file_swapped_with_its_manifest_entry_starts_cold_naming_both_digests(
    tmp_path: Path, target: TargetConfig
) -> None:
    root = _bake(tmp_path, target)
    pinned = _digest(tmp_path / "pinned-manifest.json")
    _swap_file_and_its_entry(root)
    v = _preflight(tmp_path, target)
    assert not v.warm and v.cache_root != root
    (problem,) = v.problems
    assert problem.startswith(
        f"{root}/manifest.json is {_digest(root / 'manifest.json')}, but this image "
        f"({tmp_path}/pinned-manifest.json) pins {pinned}: "
    )
    assert "seed it again from this image" in problem
    # No engine start ahead of the verdict either.
    assert pf.speculate(_env(tmp_path), FakeEngine(platform_for(target.key))) is None


def test_check_exits_with_its_mismatch_code_on_a_manifest_the_image_does_not_pin(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _bake(tmp_path, target)
    monkeypatch.setattr(
        "kernelbake.runtime.serve.preflight.get_engine", lambda _e: FakeEngine(platform_for(target.key))
    )
    monkeypatch.setenv("KERNELBAKE_UNSAFE_TARGET", str(tmp_path / "target.json"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    _swap_file_and_its_entry(root)
    capsys.readouterr()
    assert main(["check", "--unsafe-size-only"]) == KeyMismatch.return_code
    assert "but this image" in capsys.readouterr().out


def test_nothing_pinned_fails_closed(tmp_path: Path, target: TargetConfig) -> None:
    root = _bake(tmp_path, target, pin=False)
    v = _preflight(tmp_path, target)
    assert not v.warm
    assert v.problems[0].startswith(
        f"nothing pins the cache manifest: {tmp_path}/pinned-manifest.json is missing and "
        f"${MANIFEST_DIGEST_ENV} is unset, so {root}/manifest.json (sha256:"
    )


def test_a_digest_from_the_pod_pins_a_bundle_in_an_image_without_a_pinned_copy(
    tmp_path: Path, target: TargetConfig
) -> None:
    root = _bake(tmp_path, target, pin=False)
    right = _digest(root / "manifest.json")
    assert _preflight(tmp_path, target, **{MANIFEST_DIGEST_ENV: right}).warm
    wrong = "sha256:" + "0" * 64
    v = _preflight(tmp_path, target, **{MANIFEST_DIGEST_ENV: wrong})
    assert not v.warm and f"but ${MANIFEST_DIGEST_ENV} pins {wrong}" in v.problems[0]


def test_a_digest_from_the_pod_can_only_add_a_requirement_to_the_images_pin(
    tmp_path: Path, target: TargetConfig
) -> None:
    root = _bake(tmp_path, target)
    right = _digest(root / "manifest.json")
    assert _preflight(tmp_path, target, **{MANIFEST_DIGEST_ENV: right}).warm
    # The pod's digest matches a swapped manifest, the image's pin does not: cold.
    _swap_file_and_its_entry(root)
    swapped = _digest(root / "manifest.json")
    v = _preflight(tmp_path, target, **{MANIFEST_DIGEST_ENV: swapped})
    assert not v.warm and len(v.problems) == 1 and "but this image" in v.problems[0]


def test_a_malformed_digest_from_the_pod_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"\$KERNELBAKE_MANIFEST_DIGEST='abc': expected sha256:"):
        _env(tmp_path, **{MANIFEST_DIGEST_ENV: "abc"})


def test_a_pin_inside_the_cache_root_is_refused(tmp_path: Path, target: TargetConfig) -> None:
    _bake(tmp_path, target)
    # target.json moved into the cache root brings "its" pin along: a volume could replace both.
    config = json.loads((tmp_path / "target.json").read_text())
    (tmp_path / "cache" / "target.json").write_text(json.dumps(config))
    (tmp_path / "cache" / "pinned-manifest.json").write_bytes(
        (tmp_path / "cache" / "manifest.json").read_bytes()
    )
    env = RuntimeEnv.from_env(
        {
            "KERNELBAKE_UNSAFE_TARGET": str(tmp_path / "cache" / "target.json"),
            "TMPDIR": str(tmp_path / "scratch"),
        }
    )
    v = pf.preflight(env, engine=FakeEngine(platform_for(target.key)))
    assert not v.warm and "lies inside the cache root" in v.problems[0]


# -- 6: cache-root hygiene -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["../../../../../../etc/hostname", "/etc/hostname", "inductor/../../x"])
def test_a_manifest_path_outside_the_cache_root_is_never_read(
    tmp_path: Path, target: TargetConfig, path: str
) -> None:
    root = _bake(tmp_path, target)
    doc = json.loads((root / "manifest.json").read_text())
    outside = Path("/etc/hostname")
    doc["files"][0].update(path=path, size=outside.stat().st_size if outside.exists() else 1)
    (root / "manifest.json").write_text(json.dumps(doc))
    pin_manifest(tmp_path / "target.json")
    v = _preflight(tmp_path, target)
    assert not v.warm
    (problem,) = v.problems
    assert f"manifest file {path!r}" in problem and "sha256" not in problem
    if outside.exists():
        assert hashlib.sha256(outside.read_bytes()).hexdigest() not in problem


def test_manifest_paths_must_lie_under_their_kind() -> None:
    doc = {
        "schema": 1,
        "key": "x",
        "files": [{"path": "triton/a", "size": 1, "sha256": "0" * 64, "kind": "inductor"}],
    }
    with pytest.raises(BadInput, match="is not under its kind's directory inductor/"):
        Manifest.from_json(json.dumps(doc))


def test_files_and_symlinks_the_manifest_does_not_list_start_cold(
    tmp_path: Path, target: TargetConfig
) -> None:
    root = _bake(tmp_path, target)
    planted = kind_dir(root, CacheKind.INDUCTOR) / "fxgraph" / "planted.so"
    planted.parent.mkdir()
    planted.write_bytes(b"never verified")
    v = _preflight(tmp_path, target)
    assert not v.warm
    assert v.problems == ("cache integrity: inductor/fxgraph/planted.so: a file the manifest does not list",)
    planted.unlink()
    (kind_dir(root, CacheKind.TRITON) / "k").symlink_to(tmp_path, target_is_directory=True)
    v = _preflight(tmp_path, target)
    assert v.problems == ("cache integrity: triton/k: a symlink the manifest does not list",)


def test_a_listed_path_through_a_symlinked_directory_is_not_followed(
    tmp_path: Path, target: TargetConfig
) -> None:
    root = _bake(tmp_path, target)
    # The same bytes, reached through a link: still not a file of the cache root.
    (root / "inductor" / "g1").rename(tmp_path / "g1")
    (root / "inductor" / "g1").symlink_to(tmp_path / "g1", target_is_directory=True)
    v = _preflight(tmp_path, target)
    assert not v.warm
    assert "cache integrity: inductor/g1/graph.bin: not a plain file of the cache root" in v.problems[0]


# -- 8: check never crashes ----------------------------------------------------------------


class _Raising(FakeEngine):
    def __init__(self, *args: object, raises: BaseException, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.raises = raises

    def predict(  # type: ignore[override]
        self, target: TargetConfig, user_args: Sequence[str], env: Mapping[str, str]
    ) -> Prediction | None:
        raise self.raises


@pytest.mark.parametrize(
    ("raises", "reason"),
    [
        (KeyError("vllm_c"), "no prediction: KeyError: 'vllm_c'"),
        (RuntimeError("boom"), "no prediction: RuntimeError: boom"),
        (SystemExit(2), "no prediction: the engine's argument parser exited (2)"),
    ],
)
def test_an_engine_failing_to_predict_is_a_verdict_and_exit_6(
    tmp_path: Path,
    target: TargetConfig,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raises: BaseException,
    reason: str,
) -> None:
    _bake(tmp_path, target)
    engine = _Raising(platform_for(target.key), raises=raises)
    monkeypatch.setattr("kernelbake.runtime.serve.preflight.get_engine", lambda _e: engine)
    monkeypatch.setattr("kernelbake.runtime.engines.get_engine", lambda _e: engine)
    monkeypatch.setenv("KERNELBAKE_UNSAFE_TARGET", str(tmp_path / "target.json"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    capsys.readouterr()
    assert main(["check", "--enforce-eager"]) == KeyMismatch.return_code
    out = capsys.readouterr().out.splitlines()
    why = reason.removeprefix("no prediction: ")
    assert out[0] == f"UNKNOWN: no verdict from the engine ({why}); not a hit (exit 6)"
    assert out[-1] == f"  {reason}" and not [ln for ln in out if "valid" in ln]
    assert main(["check", "--json"]) == KeyMismatch.return_code
    doc = json.loads(capsys.readouterr().out)
    # No prediction is its own level (docs/vllm.md), never a hit: check exits 6 for it.
    assert doc["verdict"] == "warm" and doc["predicted"] == "unknown"
    assert doc["prediction"]["source"] == "none" and doc["prediction"]["note"] == reason.removeprefix(
        "no prediction: "
    )
    assert {k["outcome"] for k in doc["prediction"]["kinds"]} == {"unknown"}


# -- 9: any uid, read-only roots -------------------------------------------------------------


class _PrivateFiles(FakeEngine):
    """Writes a cache file 0600 in a 0700 directory, as vLLM does its model info."""

    def compile(self, target: TargetConfig, root: Path) -> CompileResult:
        result = super().compile(target, root)
        private = kind_dir(root, CacheKind.INDUCTOR) / "modelinfos"
        private.mkdir(mode=0o700)
        (private / "LlamaForCausalLM.json").write_text("{}")
        (private / "LlamaForCausalLM.json").chmod(0o600)
        (kind_dir(root, CacheKind.INDUCTOR) / "kernel.so").write_bytes(b"\x7fELF")
        (kind_dir(root, CacheKind.INDUCTOR) / "kernel.so").chmod(0o700)
        return result


def test_the_bundle_is_baked_readable_by_any_uid(tmp_path: Path, target: TargetConfig) -> None:
    root = _bake(tmp_path, target, _PrivateFiles(platform_for(target.key)))
    for p in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        want = 0o555 if p.is_dir() else 0o444
        assert mode & want == want, f"{p}: {oct(mode)}"
        assert not mode & 0o022, f"{p}: {oct(mode)} became writable by others"
    assert stat.S_IMODE((root / "inductor" / "kernel.so").stat().st_mode) == 0o744
    assert stat.S_IMODE((root / "inductor" / "g0" / "graph.bin").stat().st_mode) & 0o111 == 0


def test_no_writable_temporary_directory_names_the_recipe_before_the_probe(
    tmp_path: Path, target: TargetConfig
) -> None:
    _bake(tmp_path, target)
    (tmp_path / "ro").write_text("a file where the directory would be, as on a read-only root")

    class NoProbe(FakeEngine):
        def probe(self):  # type: ignore[no-untyped-def]
            raise AssertionError("the probe ran without a temporary directory")

    env = _env(tmp_path, TMPDIR=str(tmp_path / "ro"))
    with pytest.raises(EnvironmentProblem) as info:
        pf.preflight(env, engine=NoProbe(platform_for(target.key)))
    message = str(info.value)
    assert message.startswith(f"{tmp_path}/ro is not a writable directory, and the engine needs one to start")
    assert "docker run --read-only -v" in message and "--tmpfs /tmp:exec --shm-size 2g" in message
    assert EnvironmentProblem.return_code == 3


def test_the_read_only_copy_holds_only_what_the_manifest_lists(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _bake(tmp_path, target)
    real = pf._usable
    monkeypatch.setattr(pf, "_usable", lambda paths: root not in paths and real(paths))
    v = _preflight(tmp_path, target)
    assert v.warm and v.cache_root != root
    assert (v.cache_root / "manifest.json").read_bytes() == (root / "manifest.json").read_bytes()
    assert (v.cache_root / "inductor" / "g0" / "graph.bin").stat().st_size == 100
