"""DeepGEMM's and FlashInfer's TensorRT-LLM DeepGEMM facts (``engines.vllm.gemm_jit``) and what
``predict`` makes of them: before them, ``check`` answered ``unknown`` for every image that
baked either kind (the FP8 MoE's, 2026-12-06)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from kernelbake.runtime.engines.vllm import gemm_jit
from kernelbake.runtime.prediction import Outcome, predict

CPU = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "cpu-0.32.0-identities.json"
GEMM_KINDS = {"vllm", "inductor", "deepgemm", "trtllm-deepgemm"}
H100 = {"name": "NVIDIA H100 80GB HBM3", "sms": 132}


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed ``deep_gemm`` and ``flashinfer`` with TensorRT-LLM's DeepGEMM sources."""
    site = tmp_path / "site"
    _tree(site / "deep_gemm", {"__init__.py": "", "include/deep_gemm/gemm.cuh": "template<int SMS> x;"})
    (site / "deep_gemm/_C_extension.abi3.so").write_bytes(b"\x7fELF extension")
    _tree(
        site / "flashinfer",
        {"__init__.py": "", "data/csrc/nv_internal/tensorrt_llm/deep_gemm/compiler.cuh": "// by shape"},
    )
    nvcc = _tree(tmp_path / "cuda", {"bin/nvcc": "nvcc 13.0"})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("CUDA_HOME", str(nvcc))
    return site


def _facts(env: dict[str, str] | None = None, device: dict[str, Any] | None = None) -> dict[str, Any]:
    return gemm_jit.facts({**os.environ, **(env or {})}, device or H100)


def test_the_facts_name_the_package_vllm_imports_its_files_compiler_variables_and_device(
    packages: Path,
) -> None:
    facts = _facts({"DG_JIT_CACHE_DIR": "/opt/kernelbake/cache/deepgemm", "DG_JIT_PTXAS_VERBOSE": "1"})
    dg = facts["deepgemm"]
    assert dg["package"] == "deep_gemm"
    assert len(dg["files"]) == 64 and dg["nvcc"] != "missing"
    # The cache's place is no input of its names; the library's other variables are.
    assert list(dg["env"]) == ["DG_JIT_PTXAS_VERBOSE"]
    assert dg["device"] == H100
    assert set(facts["trtllm-deepgemm"]) == {"sources", "env"}


def test_the_digests_follow_content_not_bytecode(packages: Path) -> None:
    before = _facts()
    (packages / "deep_gemm/__pycache__").mkdir()
    (packages / "deep_gemm/__pycache__/__init__.cpython-312.pyc").write_bytes(b"written at serve")
    assert _facts() == before
    (packages / "deep_gemm/include/deep_gemm/gemm.cuh").write_text("template<int SMS> y;")
    (packages / "flashinfer/data/csrc/nv_internal/tensorrt_llm/deep_gemm/compiler.cuh").write_text("// new")
    after = _facts()
    assert after["deepgemm"]["files"] != before["deepgemm"]["files"]
    assert after["trtllm-deepgemm"]["sources"] != before["trtllm-deepgemm"]["sources"]


def test_the_nvcc_deepgemm_is_told_to_run_wins_over_cuda_home(packages: Path, tmp_path: Path) -> None:
    other = _tree(tmp_path / "other", {"nvcc": "nvcc 13.1"}) / "nvcc"
    assert _facts({"DG_JIT_NVCC_COMPILER": str(other)})["deepgemm"]["nvcc"] != _facts()["deepgemm"]["nvcc"]
    assert _facts({"DG_JIT_NVCC_COMPILER": str(tmp_path / "none")})["deepgemm"]["nvcc"] == "missing"


def test_without_the_libraries_the_facts_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemm_jit, "_package", lambda name: None)
    assert gemm_jit.facts({}, {}) == {
        "deepgemm": {"installed": False},
        "trtllm-deepgemm": {"installed": False},
    }


# -- what predict makes of them -----------------------------------------------------------------


@pytest.fixture
def baked(packages: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(CPU.read_text())["baseline"]["identity"]
    return {**doc, **_facts()}


def _now(baked: dict[str, Any], kind: str, field: str, value: Any) -> dict[str, Any]:
    now = copy.deepcopy(baked)
    now[kind][field] = value
    return now


def test_the_same_libraries_hit_both_kinds(baked: dict[str, Any]) -> None:
    p = predict(baked, copy.deepcopy(baked), GEMM_KINDS)
    assert p.hit and p.predicted == "hit", p.lines()
    assert {k.kind: k.outcome for k in p.kinds}["deepgemm"] is Outcome.HIT


@pytest.mark.parametrize(
    ("field", "value", "factor"),
    [
        ("files", "0" * 64, "deepgemm.files"),
        ("nvcc", "missing", "deepgemm.nvcc"),
        ("device", {**H100, "sms": 114}, "deepgemm.device.sms"),
        ("package", "vllm.third_party.deep_gemm", "deepgemm.package"),
    ],
)
def test_any_input_of_deepgemms_kernel_names_misses_and_is_named(
    baked: dict[str, Any], field: str, value: Any, factor: str
) -> None:
    p = predict(baked, _now(baked, "deepgemm", field, value), GEMM_KINDS)
    verdict = p.kind("deepgemm")
    assert verdict is not None and verdict.outcome is Outcome.MISS, p.lines()
    assert [c.factor for c in verdict.changes] == [factor]
    assert p.kind("trtllm-deepgemm").outcome is Outcome.HIT  # type: ignore[union-attr]


def test_a_changed_vllm_config_compiles_the_gemm_shapes_it_needs_anew(baked: dict[str, Any]) -> None:
    other = json.loads(CPU.read_text())["max_model_len-underscore"]["identity"]
    p = predict(baked, {**other, **_facts()}, GEMM_KINDS)
    for kind in ("deepgemm", "trtllm-deepgemm"):
        verdict = p.kind(kind)
        assert verdict is not None and verdict.outcome is Outcome.PARTIAL, p.lines()
        assert "GEMM shapes" in verdict.note


def test_trtllm_kernels_from_other_sources_are_not_called_a_hit(baked: dict[str, Any]) -> None:
    # Named by shape alone they would load: nothing compiles, but not what these sources build.
    p = predict(baked, _now(baked, "trtllm-deepgemm", "sources", "0" * 64), GEMM_KINDS)
    verdict = p.kind("trtllm-deepgemm")
    assert verdict is not None and verdict.outcome is Outcome.UNKNOWN, p.lines()
    assert [c.factor for c in verdict.changes] == ["trtllm-deepgemm.sources"]
    assert "rebuild the image" in verdict.note and not p.hit


def test_an_identity_recorded_before_these_facts_leaves_both_unknown(baked: dict[str, Any]) -> None:
    old = {k: v for k, v in baked.items() if k not in gemm_jit.KINDS}
    p = predict(old, copy.deepcopy(baked), GEMM_KINDS)
    for kind in gemm_jit.KINDS:
        verdict = p.kind(kind)
        assert verdict is not None and verdict.outcome is Outcome.UNKNOWN
        assert verdict.note == "kernelbake has no identity for this kind"


def test_kinds_the_bundle_has_no_files_of_stay_empty(baked: dict[str, Any]) -> None:
    p = predict(baked, copy.deepcopy(baked), {"vllm", "inductor"})
    assert p.kind("deepgemm").outcome is Outcome.EMPTY  # type: ignore[union-attr]
