"""JSON nested 200,000 deep where the runtime reads it from outside the image (issue 41 item 6):
a cache-root volume's manifest.json, a mounted delta.json. ``serve`` starts cold and says why,
``check`` exits with its code and one line, ``capture push`` refuses the directory; none of them
ends in a RecursionError traceback."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.contract.delta import DELTA_MANIFEST
from kernelbake.contract.jsondoc import MAX_JSON_DEPTH
from kernelbake.contract.manifest import MANIFEST
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import KeyMismatch
from kernelbake.runtime.compile.stage import run_compile
from kernelbake.runtime.engines.vllm import evidence
from kernelbake.runtime.serve import preflight as pf
from kernelbake.signing.keys import generate_key_pair
from tests.support.fake_engine import FakeEngine, pin_manifest, platform_for
from tests.support.runtime_target import runtime_env, write_target

DEEP = "[" * 200_000 + "]" * 200_000 + "\n"
WHY = f"JSON nested 200,000 levels deep, more than the {MAX_JSON_DEPTH} allowed"


class _Serving(FakeEngine):
    """Starts, says it is ready and exits; watched, so serve supervises it (not exec)."""

    def serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        return [sys.executable, "-c", "print('Application startup complete.', flush=True)"]

    def serve_watcher(self, cache_root: Path) -> evidence.Watcher:  # type: ignore[override]
        return evidence.watcher(evidence.cache_dirs(cache_root, self.declaration.cache_kinds))


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _Serving:
    target = write_target(tmp_path, "tiny-llama-torch.yaml")
    engine = _Serving(platform_for(target.key))
    run_compile(runtime_env(tmp_path), engine=engine)
    pin_manifest(tmp_path / "target.json")
    monkeypatch.setattr("kernelbake.runtime.engines.get_engine", lambda _e: engine)
    monkeypatch.setattr(pf, "get_engine", lambda _e: engine)
    monkeypatch.setenv("KERNELBAKE_UNSAFE_TARGET", str(tmp_path / "target.json"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    return engine


def test_serve_with_a_deep_manifest_in_the_cache_volume_starts_cold_saying_why(
    tmp_path: Path, engine: _Serving, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cache" / MANIFEST).write_text(DEEP)
    assert main(["serve"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "kernelbake serve: WARNING: starting COLD; the baked caches are not used" in err
    assert f"  - {tmp_path}/cache/{MANIFEST}: not a valid cache manifest (TooDeep: {WHY})\n" in err
    assert "Application startup complete." in err or "start-up compiled" in err


def test_check_with_a_deep_manifest_is_a_cold_verdict_not_a_traceback(
    tmp_path: Path, engine: _Serving, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cache" / MANIFEST).write_text(DEEP)
    code = main(["check", "--unsafe-size-only"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    # The verdict a bad manifest gets: a miss (cold), saying why, as for any other one.
    assert code == KeyMismatch.return_code
    assert out.startswith(f"MISS: starting COLD; the baked caches are not used (exit {code})\n")
    assert f"  - {tmp_path}/cache/{MANIFEST}: not a valid cache manifest (TooDeep: {WHY})" in out


def test_serve_with_a_deep_pinned_delta_uses_the_baked_caches_alone_saying_why(
    tmp_path: Path, engine: _Serving, monkeypatch: pytest.MonkeyPatch
) -> None:
    delta = tmp_path / "delta"
    delta.mkdir()
    (delta / DELTA_MANIFEST).write_text(DEEP)
    pinned = "sha256:" + hashlib.sha256(DEEP.encode()).hexdigest()
    v = pf.preflight(runtime_env(tmp_path, KERNELBAKE_DELTA_DIGEST=pinned), engine=engine)
    assert v.warm, "a refused delta leaves the baked caches in use"
    assert v.delta is not None and not v.delta.used
    assert WHY in v.delta.reason
    assert "starting from the baked caches alone" in v.delta.line()


def test_capture_push_of_a_deep_delta_json_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    captured = tmp_path / "captured"
    captured.mkdir()
    (captured / DELTA_MANIFEST).write_text(DEEP)
    key, _ = generate_key_pair(tmp_path / "keys", name="k")
    base = "127.0.0.1:1/kb/x@sha256:" + "0" * 64
    code = main(["capture", "push", str(captured), "--base", base, "--key", str(key)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.splitlines() == [
        f"kernelbake capture: error: {captured}/{DELTA_MANIFEST}: not a cache delta (TooDeep: {WHY})"
    ], err
