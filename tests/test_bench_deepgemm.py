"""bench/deepgemm_determinism.py without a GPU: the two fresh compiles, their caches compared,
and the verdict, with a stand-in compile that writes what DeepGEMM's JIT would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import bench

# Writes a kernel and a cubin into $DG_JIT_CACHE_DIR; the cubin's bytes differ between the two
# caches when DIFFER is in the environment (the second cache's path is ".../second").
STAND_IN = r"""
import json, os, sys
from pathlib import Path
cache = Path(os.environ["DG_JIT_CACHE_DIR"])
(cache / "cache" / "kernel.abc").mkdir(parents=True)
(cache / "cache" / "kernel.abc" / "kernel.cu").write_text("same source")
salt = cache.name if os.environ.get("DIFFER") else ""
(cache / "cache" / "kernel.abc" / "kernel.cubin").write_bytes(b"cubin" + salt.encode())
print("some log line")
print(json.dumps({"supported": True, "gemm_s": 0.5}))
"""


@pytest.mark.parametrize("differ", [False, True])
def test_two_fresh_compiles_are_compared_file_by_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, differ: bool
) -> None:
    probe = bench.load("deepgemm_determinism")
    monkeypatch.setattr(probe, "CHILD", STAND_IN)
    if differ:
        monkeypatch.setenv("DIFFER", "1")
    rc = probe.main(["--out", str(tmp_path)])
    doc = json.loads((tmp_path / "deepgemm-determinism.json").read_text())
    assert rc == 0 and [r["rc"] for r in doc["runs"]] == [0, 0]
    assert doc["runs"][0]["supported"] is True and doc["runs"][0]["gemm_s"] == 0.5
    kind = doc["determinism"]["deep_gemm"]
    assert (kind["first_files"], kind["second_files"], kind["same_paths"]) == (2, 2, 2)
    assert doc["summary"] == {
        "measured": True,
        "files": 2,
        "same_paths": 2,
        "same_bytes": 1 if differ else 2,
        "deterministic": not differ,
    }
    assert kind["other_bytes"] == (["deep_gemm/cache/kernel.abc/kernel.cubin"] if differ else [])


def test_a_compile_that_fails_is_reported_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = bench.load("deepgemm_determinism")
    monkeypatch.setattr(probe, "CHILD", "import sys; print('no DeepGEMM here'); sys.exit(3)")
    rc = probe.main(["--out", str(tmp_path)])
    doc = json.loads((tmp_path / "deepgemm-determinism.json").read_text())
    assert rc == 1
    assert [r["rc"] for r in doc["runs"]] == [3, 3] and "no DeepGEMM here" in doc["runs"][0]["error"]
    assert doc["summary"] == {
        "measured": False,
        "files": None,
        "same_paths": None,
        "same_bytes": None,
        "deterministic": None,
    }
