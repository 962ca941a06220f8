"""Per-kind predictions from identity documents recorded from real vLLM runs, their diff by
factor name, the fallback, the self-check against evidence, and that no secret value leaks.

The fixtures were recorded by ``bench/record_identity.py`` with vLLM's CPU build 0.32.0 (vLLM's
own parser, config builder and hash functions; see tests/fixtures/vllm/README.md).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from kernelbake.runtime import redact
from kernelbake.runtime.engines.vllm import evidence
from kernelbake.runtime.prediction import KindVerdict, Outcome, Prediction, Source, diff, fallback, predict

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
CPU = FIXTURES / "cpu-0.32.0-identities.json"
FIXTURE_SECRET = "kb-fixture-secret-1234"
KINDS = {"vllm", "inductor", "triton", "flashinfer"}
# What the CPU default image's bundle holds files of.
CPU_KINDS = {"vllm", "inductor"}


@pytest.fixture(scope="module")
def cpu() -> dict[str, Any]:
    docs: dict[str, Any] = json.loads(CPU.read_text())
    return {name: d["identity"] for name, d in docs.items()}


def _changes(p: Prediction, kind: str) -> list[str]:
    verdict = p.kind(kind)
    assert verdict is not None
    return [c.factor for c in verdict.changes]


def test_the_same_config_hits_every_kind(cpu: dict[str, Any]) -> None:
    p = predict(cpu["baseline"], cpu["baseline"], KINDS)
    assert p.hit and p.source is Source.ENGINE
    assert {k.kind: k.outcome for k in p.kinds} == {k: Outcome.HIT for k in KINDS}


@pytest.mark.parametrize("variant", ["explicit-default-aot", "max-model-len-same"])
def test_defaults_written_explicitly_hit(cpu: dict[str, Any], variant: str) -> None:
    p = predict(cpu["baseline"], cpu[variant], KINDS)
    assert p.hit, p.lines()


@pytest.mark.parametrize(
    ("variant", "factor", "baked", "now"),
    [
        ("max_model_len-underscore", "model_config.max_model_len", "2048", "1024"),
        ("max-logprobs-5", "model_config.max_logprobs", "20", "5"),
        ("block-size-32", "cache_config.block_size", None, "32"),
        ("max-num-batched-tokens", "scheduler_config field.max_num_batched_tokens", "2048", "1024"),
    ],
)
def test_a_hashed_flag_misses_torch_compile_and_names_the_factor(
    cpu: dict[str, Any], variant: str, factor: str, baked: str | None, now: str
) -> None:
    p = predict(cpu["baseline"], cpu[variant], KINDS)
    assert not p.hit
    vllm = p.kind("vllm")
    assert vllm is not None and vllm.outcome is Outcome.MISS
    change = next(c for c in vllm.changes if c.factor == factor)
    if baked is not None:
        assert change.baked == baked
    assert change.now == now
    # Inductor's own key (outside the model) does not depend on vLLM's flags.
    assert p.kind("inductor").outcome is Outcome.HIT  # type: ignore[union-attr]
    assert p.kind("triton").outcome is Outcome.PARTIAL  # type: ignore[union-attr]
    assert any(r.startswith(f"vllm: {factor}: ") for r in p.reasons)


def test_vllm_0_32_leaves_the_api_key_out_of_its_hash(cpu: dict[str, Any]) -> None:
    # 0.32 lists VLLM_API_KEY in compile_factors' ignored_factors (0.26 hashes it: see the
    # H200 fixture test below), so setting it hits.
    assert "VLLM_API_KEY" not in cpu["api-key"]["env"]["factors"]
    assert predict(cpu["baseline"], cpu["api-key"], KINDS).hit


def test_a_hashed_secret_is_diffed_by_digest_only(cpu: dict[str, Any]) -> None:
    baked = copy.deepcopy(cpu["baseline"])
    now = copy.deepcopy(cpu["baseline"])
    # As identity.env_factors stores a hashed secret-carrying variable.
    now["env"]["factors"] = redact.tree({**now["env"]["factors"], "VLLM_API_KEY": FIXTURE_SECRET})
    now["env"]["hash"] = "changed"
    p = predict(baked, now, KINDS)
    (change,) = p.kind("vllm").changes  # type: ignore[union-attr]
    assert (change.factor, change.baked, change.now) == (
        "env.VLLM_API_KEY",
        "absent",
        redact.digest(FIXTURE_SECRET),
    )
    assert FIXTURE_SECRET not in json.dumps(p.to_json()) + "\n".join(p.lines())


def test_no_fixture_holds_a_secret_value() -> None:
    # The recorder ran vLLM with VLLM_API_KEY set.
    for path in FIXTURES.glob("*.json"):
        assert FIXTURE_SECRET not in path.read_text()
        assert "kb-secret-7f3a9c" not in path.read_text()  # bench/vllm_keymatrix.py's


def test_logging_level_does_not_change_the_hash_where_vllm_does_not_tie_asserts_to_it(
    cpu: dict[str, Any],
) -> None:
    # torch 2.13 (the CPU build): vLLM leaves Inductor's asserts alone, so nothing is pinned
    # and DEBUG hits; on torch < 2.12 the pins (asked of vLLM) make it hit.
    assert cpu["baseline"]["pins"] == {}
    assert predict(cpu["baseline"], cpu["logging-debug"], KINDS).hit


def _with_device(doc: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["compiler"]["factors"]["system"] = {"device": {"name": name}, "version": {"cuda": "13.0"}}
    out["compiler"]["hash"] = name
    return out


def test_a_device_name_change_misses_only_what_keys_on_the_name(cpu: dict[str, Any]) -> None:
    baked = _with_device(cpu["baseline"], "NVIDIA H200")
    baked["triton"] = {"version": "3.6.0", "backend": "ptxas-13.0-90"}
    now = _with_device(cpu["baseline"], "NVIDIA H200 NVL")
    now["triton"] = dict(baked["triton"])
    p = predict(baked, now, KINDS)
    outcomes = {k.kind: k.outcome for k in p.kinds}
    # Triton's own key (ptxas, arch) is unchanged: its kernels are kept, and only those whose
    # source the recompiled graphs change compile.
    assert outcomes == {
        "vllm": Outcome.MISS,
        "inductor": Outcome.MISS,
        "triton": Outcome.PARTIAL,
        "flashinfer": Outcome.HIT,
    }
    assert "compiler.system.device.name" in _changes(p, "vllm")


def test_fallback_keeps_the_kinds_whose_recorded_factors_do_not_name_the_device(cpu: dict[str, Any]) -> None:
    baked = _with_device(cpu["baseline"], "NVIDIA H200")
    p = fallback(
        ["vllm", "triton", "flashinfer"], [], baked_identity=baked, device=("NVIDIA H200", "NVIDIA H200 NVL")
    )
    assert p.source is Source.FALLBACK
    assert {k.kind: k.outcome for k in p.kinds} == {
        "vllm": Outcome.MISS,
        "triton": Outcome.HIT,
        "flashinfer": Outcome.HIT,
    }
    assert "FALLBACK" in p.lines()[0]


def test_kinds_with_nothing_baked_cannot_miss(cpu: dict[str, Any]) -> None:
    p = predict(cpu["baseline"], cpu["max_model_len-underscore"], {"vllm"})
    assert p.kind("flashinfer").outcome is Outcome.EMPTY  # type: ignore[union-attr]


def test_diff_names_each_leaf() -> None:
    assert [str(c) for c in diff({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}, "d": 0})] == [
        "a.c: 2 → 3",
        "d: absent → 0",
    ]


def test_prediction_round_trips_through_the_log_line(cpu: dict[str, Any]) -> None:
    p = predict(cpu["baseline"], cpu["max_model_len-underscore"], KINDS)
    assert Prediction.from_json(json.loads(json.dumps(p.to_json()))) == p


# -- the self-check after start -------------------------------------------------------


def _watch(tmp_path: Path, p: Prediction, lines: list[str], new_files: dict[str, int]) -> evidence.Watcher:
    dirs = {k: tmp_path / k for k in ("vllm", "triton")}
    for d in dirs.values():
        d.mkdir()
    w = evidence.watcher(dirs)
    w(evidence.PREDICTION_MARK + json.dumps(p.to_json()) + "\n")
    for kind, n in new_files.items():
        for i in range(n):
            (dirs[kind] / f"f{i}").write_text("x")
    for line in lines:
        w(line)
    return w


def test_serve_says_loudly_when_a_predicted_hit_compiled(cpu: dict[str, Any], tmp_path: Path) -> None:
    p = predict(cpu["baseline"], cpu["baseline"], {"vllm", "triton"})
    w = _watch(
        tmp_path,
        p,
        ["INFO Compiling a graph for compile range (1, 16384)\n"],
        {"vllm": 2},
    )
    message = w("INFO:     Application startup complete.\n")
    assert (
        message is not None
        and "prediction wrong: predicted hit for vllm, vLLM compiled (2 new files in vllm" in message
    )
    assert w.status()["prediction_wrong"] and w.status()["evidence"]["actual"]["vllm"] == "miss"  # type: ignore[index]


def test_a_file_rewritten_in_place_is_evidence_too(tmp_path: Path) -> None:
    # Inductor regenerates a baked module under the same name when its graph compiles again.
    d = tmp_path / "inductor"
    (d / "ab").mkdir(parents=True)
    (d / "ab" / "module.py").write_text("old")
    before = evidence.snapshot({"inductor": d})
    (d / "ab" / "module.py").write_text("regenerated")
    assert evidence.added(before, evidence.snapshot({"inductor": d})) == {"inductor": {"ab/module.py"}}
    assert evidence.added(before, before) == {"inductor": set()}


@pytest.mark.parametrize(
    ("outcome", "files", "wrong"),
    [
        (Outcome.RETRACE, 0, False),
        (Outcome.RETRACE, 1, True),
        (Outcome.SKIPPED, 0, False),
        (Outcome.SKIPPED, 3, True),
        (Outcome.BYPASSED, 0, True),
        (Outcome.BYPASSED, 2, False),
        (Outcome.UNKNOWN, 0, False),
        (Outcome.UNKNOWN, 2, False),
        # A debug knob: its files are what was predicted, and none is what was not.
        (Outcome.WRITES, 12, False),
        (Outcome.WRITES, 0, True),
    ],
)
def test_the_self_check_holds_each_level_to_what_it_promises(
    tmp_path: Path, outcome: Outcome, files: int, wrong: bool
) -> None:
    p = Prediction(Source.ENGINE, (KindVerdict("vllm", outcome, (), "why"),))
    w = _watch(tmp_path, p, [], {"vllm": files})
    w("Application startup complete.\n")
    assert bool(w.wrong) is wrong, w.wrong


def test_serve_says_loudly_when_a_predicted_miss_compiled_nothing(
    cpu: dict[str, Any], tmp_path: Path
) -> None:
    p = predict(cpu["baseline"], cpu["max-logprobs-5"], {"vllm", "triton"})
    w = _watch(tmp_path, p, ["Directly load AOT compilation from path /x\n"], {})
    message = w("Application startup complete.\n")
    assert message is not None
    assert (
        "prediction wrong: predicted miss (model_config.max_logprobs: 20 → 5), vLLM compiled nothing for vllm"
        in message
    )


def test_a_right_prediction_adds_no_warning(cpu: dict[str, Any], tmp_path: Path) -> None:
    p = predict(cpu["baseline"], cpu["baseline"], {"vllm", "triton"})
    w = _watch(tmp_path, p, ["Directly load AOT compilation from path /x\n"], {})
    message = w("Application startup complete.\n")
    assert message is not None and "prediction wrong" not in message
    assert w.status()["prediction_wrong"] == []


# -- secrets -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("VLLM_API_KEY", True),
        ("HF_TOKEN", True),
        ("--api-key", True),
        ("S3_SECRET_ACCESS_KEY", True),
        ("hf_token", True),
        ("VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE", False),
        ("long_prefill_token_threshold", False),
        ("max_num_batched_tokens", False),
        ("VLLM_LOGGING_LEVEL", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert redact.is_secret(name) is secret


def test_the_redactor_hides_secret_flags_and_variables_in_any_text() -> None:
    r = redact.Redactor.for_run(
        {"VLLM_API_KEY": "s3cr3t-env", "PATH": "/bin"}, ["--api-key=s3cr3t-flag", "--hf-token", "s3cr3t-hf"]
    )
    text = r(
        "vllm serve --api-key=s3cr3t-flag --hf-token s3cr3t-hf; non-default args: {'api_key': ['s3cr3t-env']} /bin"
    )
    for value in ("s3cr3t-env", "s3cr3t-flag", "s3cr3t-hf"):
        assert value not in text and redact.digest(value) in text
    assert "/bin" in text


def test_the_runner_forwards_engine_output_redacted(capfd: pytest.CaptureFixture[str]) -> None:

    from kernelbake.runner import run

    r = redact.Redactor(["sk-live-123456"])
    seen: list[str] = []
    run(
        [sys.executable, "-c", "print('key is sk-live-123456')", "--api-key", "sk-live-123456"],
        on_line=seen.append,
        redact=r,
    )
    err = capfd.readouterr().err
    assert "sk-live-123456" not in err and redact.digest("sk-live-123456") in err


def test_pins_become_the_compilation_config_flag_and_the_users_own_values_win() -> None:
    from kernelbake.runtime.engines.vllm.args import with_pins

    pins = {"size_asserts": False, "alignment_asserts": False}
    assert with_pins(["/m", "--dtype", "bfloat16"], pins) == [
        "/m",
        "--compilation-config",
        '{"inductor_compile_config":{"alignment_asserts":false,"size_asserts":false}}',
        "--dtype",
        "bfloat16",
    ]
    merged = with_pins(
        ["/m", "--compilation-config", '{"inductor_compile_config":{"size_asserts":true},"mode":3}'], pins
    )
    assert json.loads(merged[2]) == {
        "inductor_compile_config": {"size_asserts": True, "alignment_asserts": False},
        "mode": 3,
    }
    assert with_pins(["/m"], {}) == ["/m"]


# -- vLLM 0.26 on the H200 (bench/vllm_keymatrix.py, check --identity-out) --------------

H200 = FIXTURES / "h200-0.26.0-identities.json"


@pytest.fixture(scope="module")
def h200() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(H200.read_text())
    return doc


def _h200(h200: dict[str, Any], case: str) -> Prediction:
    return predict(h200["baked"], h200["cases"][case]["identity"], h200["kinds"])


@pytest.mark.parametrize("case", ["baseline", "logging-debug", "max-num-seqs-512"])
def test_h200_hits(h200: dict[str, Any], case: str) -> None:
    p = _h200(h200, case)
    assert p.hit, p.lines()
    assert {k.kind: k.outcome for k in p.kinds if k.outcome is not Outcome.EMPTY} == {
        "vllm": Outcome.HIT,
        "triton": Outcome.HIT,
        "flashinfer": Outcome.HIT,
    }


def test_h200_debug_hits_because_the_build_pinned_the_assert_options(h200: dict[str, Any]) -> None:
    # Asked of vLLM 0.26 on torch 2.11: these three follow VLLM_LOGGING_LEVEL.
    assert h200["baked"]["pins"] == {
        "alignment_asserts": False,
        "scalar_asserts": False,
        "size_asserts": False,
    }
    debug = h200["cases"]["logging-debug"]
    assert debug["env"] == {"VLLM_LOGGING_LEVEL": "DEBUG"}
    assert debug["identity"]["config"]["hash"] == h200["baked"]["config"]["hash"]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("max_model_len-underscore", "vllm: model_config.max_model_len: 4096 → 2048"),
        ("block-size-32", "vllm: cache_config.block_size: 16 → 32"),
        ("max-logprobs-5", "vllm: model_config.max_logprobs: 20 → 5"),
        ("api-key-secret", "vllm: env.VLLM_API_KEY: null → sha256:24e66f893695"),
    ],
)
def test_h200_misses_name_the_factor(h200: dict[str, Any], case: str, reason: str) -> None:
    p = _h200(h200, case)
    assert not p.hit
    assert p.reasons == [reason]
    assert {k.kind: k.outcome for k in p.kinds if k.outcome is not Outcome.EMPTY} == {
        "vllm": Outcome.MISS,
        "triton": Outcome.PARTIAL,
        "flashinfer": Outcome.PARTIAL if case != "api-key-secret" else Outcome.HIT,
    }


def test_h200_identity_records_what_vllm_named_and_traced(h200: dict[str, Any]) -> None:
    baked = h200["baked"]
    assert baked["dirs"]["torch_compile_cache"] and baked["dirs"]["torch_aot_compile"]
    assert baked["compiler"]["factors"]["system"]["device"]["name"] == "NVIDIA H200"
    assert all(len(d) == 64 for d in baked["code_files"].values())
    assert "/opt/kernelbake/cache/flashinfer" in baked["ninja_paths"]
    assert baked["triton"]["backend"].endswith("-90")


_STATE = {
    "mode": "DYNAMO_TRACE_ONCE",
    "backend": "inductor",
    "switches": {
        "torch._functorch.config.enable_autograd_cache": True,
        "torch._inductor.config.force_disable_caches": False,
        "torch._inductor.config.fx_graph_cache": True,
        "vllm is_compile_cache_enabled": True,
    },
    "dirs": {"inductor": "/opt/kernelbake/cache/inductor", "vllm": "/opt/kernelbake/cache/vllm"},
}


def _with_state(doc: dict[str, Any], graphs: str | None = None, **changes: Any) -> dict[str, Any]:
    state = copy.deepcopy(_STATE)
    for key, value in changes.items():
        if key in ("switches", "dirs"):
            state[key].update(value)
        else:
            state[key] = value
    out = {**copy.deepcopy(doc), "compile": state}
    if graphs:
        out["graphs"] = graphs
    return out


def test_on_the_cpu_build_a_hashed_flag_is_unknown_until_inductor_is_asked(cpu: dict[str, Any]) -> None:
    # vLLM's CPU build (VLLM_USE_AOT_COMPILE=0): the graphs are Inductor's FX-graph cache
    # entries, keyed on the traced graph, not on vLLM's hash. Serve's fast path cannot tell
    # (unknown, named); the vllm kind holds only model info.
    baked = _with_state(cpu["baseline"], "inductor")
    now = _with_state(cpu["max-logprobs-5"], "inductor")
    p = predict(baked, now, CPU_KINDS)
    assert not p.hit and p.predicted == "unknown"
    assert p.kind("vllm").outcome is Outcome.HIT  # type: ignore[union-attr]
    inductor = p.kind("inductor")
    assert inductor is not None and inductor.outcome is Outcome.UNKNOWN
    assert "model_config.max_logprobs" in _changes(p, "inductor")
    assert any("kernelbake check' traces" in r for r in p.reasons)
    assert predict(baked, _with_state(cpu["baseline"], "inductor"), CPU_KINDS).predicted == "hit"


def test_on_the_cpu_build_a_traced_graph_inductor_holds_is_a_retrace(cpu: dict[str, Any]) -> None:
    baked = _with_state(cpu["baseline"], "inductor")
    now = {
        **_with_state(cpu["max_model_len-underscore"], "inductor"),
        "inductor_trace": {"compiled": False, "took_s": 21.5},
    }
    p = predict(baked, now, CPU_KINDS)
    # Nothing compiles (check exits 0), and the level says the trace is paid, with its cost.
    assert p.hit and p.predicted == "retrace"
    assert p.kind("inductor").outcome is Outcome.RETRACE  # type: ignore[union-attr]
    assert "inductor: model_config.max_model_len: 2048 → 1024" in p.reasons
    assert any(r.startswith("inductor: retrace: ") and "21.5 s" in r for r in p.reasons)
    # The same trace with nothing changed is a plain hit.
    same = {**_with_state(cpu["baseline"], "inductor"), "inductor_trace": {"compiled": False}}
    assert predict(baked, same, CPU_KINDS).predicted == "hit"


def test_on_the_cpu_build_a_graph_inductor_lacks_is_a_miss_even_with_the_same_config(
    cpu: dict[str, Any],
) -> None:
    # A patched model file with the same values: vLLM's hash is the same, the graph is not.
    baked = _with_state(cpu["baseline"], "inductor")
    now = {**_with_state(cpu["baseline"], "inductor"), "inductor_trace": {"compiled": True}}
    p = predict(baked, now, CPU_KINDS)
    assert not p.hit and p.predicted == "miss"
    assert _changes(p, "inductor") == ["Inductor's cache"]


def test_on_the_cpu_build_a_changed_model_module_misses_vllms_model_info(cpu: dict[str, Any]) -> None:
    # vLLM keys VLLM_CACHE_ROOT/modelinfos on the module's contents: a comment added to the
    # model file rewrites that entry (seen in the CPU matrix) while the graph stays the same.
    module = "/site/vllm/model_executor/models/llama.py"
    baked = {**_with_state(cpu["baseline"], "inductor"), "code_files": {module: "a" * 64}}
    now = {
        **_with_state(cpu["baseline"], "inductor"),
        "code_files": {module: "b" * 64},
        "model_modules": [module],
        "inductor_trace": {"compiled": False},
    }
    p = predict(baked, now, CPU_KINDS)
    vllm = p.kind("vllm")
    assert vllm is not None and vllm.outcome is Outcome.MISS and p.predicted == "miss"
    assert vllm.changes[0].factor == f"model info key (module {module})"
    assert p.kind("inductor").outcome is Outcome.RETRACE  # type: ignore[union-attr]


def test_compiler_changes_are_named_once(cpu: dict[str, Any]) -> None:
    baked = _with_state(cpu["baseline"], "inductor")
    now = _with_state(cpu["baseline"], "inductor")
    now["compiler"] = {
        **now["compiler"],
        "hash": "other",
        "factors": {**now["compiler"]["factors"], "torch_key": "x"},
    }
    p = predict(baked, now, KINDS)
    assert len(p.reasons) == len(set(p.reasons))
    assert sum("torch_key" in r for r in p.reasons) == 1


@pytest.mark.parametrize(
    ("graphs", "state", "reason"),
    [
        ("vllm", {"mode": "NONE"}, "compilation_config.mode: DYNAMO_TRACE_ONCE → NONE"),
        ("inductor", {"mode": "NONE"}, "compilation_config.mode: DYNAMO_TRACE_ONCE → NONE"),
        ("inductor", {"backend": "eager"}, "compilation_config.backend: inductor → eager"),
    ],
)
def test_a_start_that_compiles_nothing_says_so(
    cpu: dict[str, Any], graphs: str, state: dict[str, Any], reason: str
) -> None:
    p = predict(_with_state(cpu["baseline"], graphs), _with_state(cpu["baseline"], graphs, **state), KINDS)
    assert p.hit and p.predicted == "no-compile"
    for kind in ("vllm", "inductor"):
        assert p.kind(kind).outcome is Outcome.SKIPPED  # type: ignore[union-attr]
    assert f"inductor: {reason}" in p.reasons
    assert any("no-compile: " in r for r in p.reasons)


@pytest.mark.parametrize(
    ("switches", "dirs", "reason"),
    [
        (
            {"torch._inductor.config.fx_graph_cache": False},
            {},
            "torch._inductor.config.fx_graph_cache: True → False",
        ),
        ({"torch._inductor.config.force_disable_caches": True}, {}, "force_disable_caches: False → True"),
        ({"vllm is_compile_cache_enabled": False}, {}, "vllm is_compile_cache_enabled: True → False"),
        ({}, {"vllm": "/tmp/elsewhere"}, "vllm cache directory: /opt/kernelbake/cache/vllm → /tmp/elsewhere"),
    ],
)
def test_a_knob_that_switches_a_cache_off_is_bypassed_and_named(
    h200: dict[str, Any], switches: dict[str, Any], dirs: dict[str, Any], reason: str
) -> None:
    baked = _with_state(h200["baked"])
    now = _with_state(h200["cases"]["baseline"]["identity"], switches=switches, dirs=dirs)
    p = predict(baked, now, KINDS)
    assert not p.hit and p.predicted == "bypassed"
    assert p.kind("vllm").outcome is Outcome.BYPASSED  # type: ignore[union-attr]
    assert any(reason in r for r in p.reasons), p.reasons
    # The same switch already off at build time bypasses nothing new.
    assert predict(_with_state(h200["baked"], switches=switches, dirs=dirs), now, KINDS).predicted == "hit"


def test_a_bundle_kernelbake_placed_elsewhere_is_not_a_bypass(cpu: dict[str, Any]) -> None:
    # A read-only root: serve copies the bundle to a writable place and points the engine there.
    moved = {"inductor": "/tmp/kb-copy/inductor", "vllm": "/tmp/kb-copy/vllm"}
    now = _with_state(cpu["baseline"], "inductor", dirs=moved)
    now["cache_env"] = {
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/kb-copy/inductor",
        "VLLM_CACHE_ROOT": "/tmp/kb-copy/vllm",
    }
    assert predict(_with_state(cpu["baseline"], "inductor"), now, CPU_KINDS).predicted == "hit"
    now["cache_env"] = {}
    assert predict(_with_state(cpu["baseline"], "inductor"), now, CPU_KINDS).predicted == "bypassed"


def test_on_the_cpu_build_a_switched_off_cache_the_trace_still_finds_is_a_retrace(
    cpu: dict[str, Any],
) -> None:
    baked = _with_state(cpu["baseline"], "inductor")
    off = {"torch._functorch.config.enable_autograd_cache": False}
    now = {**_with_state(cpu["baseline"], "inductor", switches=off), "inductor_trace": {"compiled": False}}
    assert predict(baked, now, CPU_KINDS).predicted == "retrace"
    # The FX-graph cache off: Inductor generates the code again, its kernels load by source.
    fx_off = {"torch._inductor.config.fx_graph_cache": False}
    regenerated = {"compiled": False, "codegen": True}
    p = predict(
        baked,
        {**_with_state(cpu["baseline"], "inductor", switches=fx_off), "inductor_trace": regenerated},
        CPU_KINDS,
    )
    assert p.hit and p.predicted == "retrace"
    assert "inductor: torch._inductor.config.fx_graph_cache: True → False" in p.reasons
    assert any("generates the graph's code again" in r for r in p.reasons)
    now["inductor_trace"] = {"compiled": True}
    p = predict(baked, now, CPU_KINDS)
    assert (
        p.predicted == "bypassed"
        and "inductor: torch._functorch.config.enable_autograd_cache: True → False" in p.reasons
    )


def test_a_model_config_hashed_as_json_names_the_field() -> None:
    baked = {
        "hf_config": json.dumps({"architectures": ["LlamaForCausalLM"], "rope_theta": 10000.0}, indent=2)
    }
    now = {"hf_config": json.dumps({"architectures": ["LlamaForCausalLM"], "rope_theta": 20000.0}, indent=2)}
    assert [str(c) for c in diff(baked, now, "model_config")] == [
        "model_config.hf_config.rope_theta: 10000.0 → 20000.0"
    ]


# -- the serve-time prediction runs beside the engine core's start ---------------------------

_DETACHED = r"""
import os, sys, time
from kernelbake.runtime.engines.vllm import predict

def work():
    time.sleep(float(sys.argv[1]))
    if sys.argv[2] == "raise":
        raise SystemExit("the copy must not return into the caller")
    return "kernelbake: from the copy\n" + "x" * 10000 + "\n"

t0 = time.monotonic()
sys.stdout.write("buffered before the fork ")
predict._detached(work)
print(f"caller back after {time.monotonic() - t0:.2f} s", flush=True)
try:
    os.waitpid(-1, os.WNOHANG)
    print("caller has a child left")
except ChildProcessError:
    print("caller has no child left")
time.sleep(float(sys.argv[1]) + 1.5)
"""


@pytest.mark.parametrize("ends", ["return", "raise"])
def test_the_prediction_is_stated_by_a_detached_copy_while_the_caller_goes_on(ends: str) -> None:
    import subprocess

    res = subprocess.run(
        [sys.executable, "-c", _DETACHED, "1.0", ends], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    # The caller did not wait for the work, and keeps no child (no zombie in vLLM's server).
    assert out[0].startswith("buffered before the fork caller back after 0.")
    assert out[1:] == ["caller has no child left"]
    # What was buffered before the fork is written once, by the caller alone.
    assert res.stdout.count("buffered before the fork") == 1
    if ends == "return":
        # One write, whole, though over PIPE_BUF: the line after it is intact.
        assert res.stderr == "kernelbake: from the copy\n" + "x" * 10000 + "\n"
    else:
        # The copy never returns into the caller's code: no second "caller back" line.
        assert res.stderr == "" and res.stdout.count("caller back") == 1


# -- found by the H200 matrix of 2026-12-02 (bench/results/vllm-0.26.0-h200-keymatrix.json) ----


def test_vllm_disable_compile_cache_on_the_h200_is_bypassed_not_a_hit(h200: dict[str, Any]) -> None:
    # VLLM_DISABLE_COMPILE_CACHE=1 also turns vLLM's AOT-compile default off, so the start
    # stores graphs the CPU build's way; the baked graphs are vLLM's AOT artifact all the same,
    # and vLLM compiled again (Inductor wrote 28 files). Predicted a reasonless hit before.
    baked = _with_state(h200["baked"], "vllm")
    now = _with_state(
        h200["cases"]["baseline"]["identity"], "inductor", switches={"vllm is_compile_cache_enabled": False}
    )
    p = predict(baked, now, h200["kinds"])
    assert not p.hit and p.predicted == "bypassed"
    assert p.kind("vllm").outcome is Outcome.BYPASSED  # type: ignore[union-attr]
    assert "vllm: vllm is_compile_cache_enabled: True → False" in p.reasons


def test_aot_compile_off_for_one_start_is_a_retrace_of_the_baked_graphs(h200: dict[str, Any]) -> None:
    baked = _with_state(h200["baked"], "vllm")
    now = _with_state(h200["cases"]["baseline"]["identity"], "inductor")
    p = predict(baked, now, h200["kinds"])
    assert p.hit and p.predicted == "retrace"
    assert p.reasons[0] == "vllm: vLLM AOT compile: on → off"
    # A hashed change as well: the graphs are compiled again.
    changed = _with_state(h200["cases"]["block-size-32"]["identity"], "inductor")
    assert predict(baked, changed, h200["kinds"]).predicted == "miss"


def _enforce_eager(identity: dict[str, Any]) -> dict[str, Any]:
    """What vLLM 0.26 gives with ``--enforce-eager`` on the H200: compilation off, and its own
    whole-config hash failing (KernelConfig: KeyError 'vllm_c'), so no top hash."""
    now = _with_state(identity, "vllm", mode="NONE")
    config = now["config"]
    config["hash"], config["other"], config["error"] = None, None, "KeyError: 'vllm_c'"
    config["configs"]["compilation_config"] = {"hash": "other", "factors": {"mode": "NONE"}}
    config["configs"]["kernel_config"] = {"hash": None, "error": "KeyError: 'vllm_c'"}
    now["aot"] = {"error": "KeyError: 'vllm_c'"}
    return now


def test_enforce_eager_on_the_h200_is_no_compile_although_vllms_hash_fails(h200: dict[str, Any]) -> None:
    baked = _with_state(h200["baked"], "vllm")
    p = predict(baked, _enforce_eager(h200["cases"]["baseline"]["identity"]), h200["kinds"])
    assert p.hit and p.predicted == "no-compile", p.reasons
    assert {k.kind: k.outcome for k in p.kinds if k.outcome is not Outcome.EMPTY} == {
        "vllm": Outcome.SKIPPED,
        "triton": Outcome.HIT,
        "flashinfer": Outcome.HIT,
    }
    # A change FlashInfer's modules do depend on still shows with compilation off.
    other = _enforce_eager(h200["cases"]["block-size-32"]["identity"])
    assert predict(baked, other, h200["kinds"]).kind("flashinfer").outcome is Outcome.PARTIAL  # type: ignore[union-attr]


def test_a_config_vllm_cannot_hash_still_yields_its_sub_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from kernelbake.runtime.engines.vllm import _v0_26, compat_layer, identity

    # A release whose configs only hash (0.26), without vLLM's hash functions here: record
    # nothing, name no fields.
    monkeypatch.setattr(compat_layer, "lookups", lambda: _v0_26.LOOKUPS)
    monkeypatch.setattr(identity, "_recording", lambda: contextlib.nullcontext([]))
    monkeypatch.setattr(identity, "_fields", lambda config: {})

    class Sub:
        def __init__(self, h: str) -> None:
            self.h = h

        def compute_hash(self) -> str:
            return self.h

    import dataclasses as dc

    @dc.dataclass
    class Config:
        model_config: Any
        kernel_config: Any

        def compute_hash(self) -> str:
            raise KeyError("vllm_c")

    class Broken:
        def compute_hash(self) -> str:
            raise KeyError("vllm_c")

    doc = identity.config_factors(Config(Sub("m1"), Broken()))
    assert doc["hash"] is None and doc["other"] is None and doc["error"] == "KeyError: 'vllm_c'"
    assert doc["configs"]["model_config"] == {"hash": "m1", "factors": None, "fields": {}}
    assert doc["configs"]["kernel_config"] == {"hash": None, "error": "KeyError: 'vllm_c'"}


def test_a_baked_file_rewritten_with_the_same_bytes_compiled_nothing(tmp_path: Path) -> None:
    # On the H200 every start rewrote 12 files of the vllm kind and 2 of FlashInfer's with
    # the bytes they had (a new mtime only); counted as compiles, they made every hit a miss.
    import hashlib
    import os

    root = tmp_path / "cache"
    d = root / "vllm"
    (d / "locks").mkdir(parents=True)
    (d / "locks" / "a.lock").write_text("")
    (d / "module.py").write_text("baked")
    files = [
        (p.relative_to(root).as_posix(), hashlib.sha256(p.read_bytes()).hexdigest())
        for p in d.rglob("*")
        if p.is_file()
    ]
    dirs = {"vllm": d}
    baked = evidence.baked_digests(root, dirs, files)
    empty, module = hashlib.sha256(b"").hexdigest(), hashlib.sha256(b"baked").hexdigest()
    assert baked == {"vllm": {"locks/a.lock": empty, "module.py": module}}
    before = evidence.snapshot(dirs)
    (d / "locks" / "a.lock").write_text("")
    os.utime(d / "locks" / "a.lock", ns=(1, 1))
    (d / "module.py").write_text("baked")
    os.utime(d / "module.py", ns=(2, 2))
    after = evidence.snapshot(dirs)
    assert evidence.added(before, after) == {"vllm": {"locks/a.lock", "module.py"}}
    assert evidence.added(before, after, dirs, baked) == {"vllm": set()}
    # Other bytes, or a file the bundle did not have, still count.
    (d / "module.py").write_text("regenerated")
    (d / "new.so").write_text("x")
    assert evidence.added(before, evidence.snapshot(dirs), dirs, baked) == {"vllm": {"module.py", "new.so"}}


def test_the_log_flashinfer_appends_to_at_every_start_compiled_nothing(tmp_path: Path) -> None:
    # On the H200 (2026-12-02, 41 cases) every start that loaded everything still "added" one
    # file: FlashInfer's flashinfer_jit.log, which it appends to at each start and which the
    # bundle's manifest lists under ``logs``, not among the cache files.
    from kernelbake.contract.key import parse_key
    from kernelbake.contract.layout import CacheKind
    from kernelbake.runtime.bundle import write_manifest
    from kernelbake.runtime.engines.vllm import APPENDED_LOGS

    root = tmp_path / "cache"
    ws = root / "flashinfer" / ".cache" / "flashinfer" / "0.6.14" / "90a"
    (ws / "cached_ops" / "norm").mkdir(parents=True)
    (ws / "cached_ops" / "norm" / "norm.so").write_bytes(b"\x7fELF")
    (ws / "flashinfer_jit.log").write_text("start 1\n")
    key = parse_key(
        "kb1:engine=vllm;engine_version=0.26.0;torch=2.11.0;triton=3.6.0;cuda=13.0;flashinfer=0.6.14;"
        "python=3.12;arch=sm_90a;device=NVIDIA%20H200;driver_floor=580.65.06;model=local/m;revision=r;"
        "model_path=/models/m;dtype=bfloat16;quantization=none;tp=1;pp=1;ep=1;max_model_len=4096;"
        "max_num_batched_tokens=16384;compilation=c;engine_env=e;kernelbake=0.1.0"
    )
    write_manifest(root, key, [CacheKind.FLASHINFER], logs=APPENDED_LOGS)
    dirs = evidence.cache_dirs(root, [CacheKind.FLASHINFER])
    baked = evidence.manifest_digests(root, dirs)
    log = ".cache/flashinfer/0.6.14/90a/flashinfer_jit.log"
    assert baked["flashinfer"][log] == evidence.APPENDED_LOG
    before = evidence.snapshot(dirs)
    with (ws / "flashinfer_jit.log").open("a") as fh:
        fh.write("start 2\n")
    after = evidence.snapshot(dirs)
    assert evidence.added(before, after) == {"flashinfer": {log}}
    assert evidence.added(before, after, dirs, baked) == {"flashinfer": set()}
    # A module FlashInfer builds beside it still counts.
    (ws / "cached_ops" / "rope").mkdir()
    (ws / "cached_ops" / "rope" / "rope.so").write_bytes(b"\x7fELF")
    found = evidence.added(before, evidence.snapshot(dirs), dirs, baked)
    assert found == {"flashinfer": {".cache/flashinfer/0.6.14/90a/cached_ops/rope/rope.so"}}


def test_a_baked_autotune_result_benchmarked_again_is_named_and_is_not_a_compile(
    cpu: dict[str, Any], tmp_path: Path
) -> None:
    # The FP8 MoE on the H200 (2026-12-02): every baked start rewrote 4 baked Inductor
    # .best_config files with a new time_taken_ms, and no Triton file was added.
    import hashlib

    root = tmp_path / "cache"
    dirs = {k: root / k for k in ("vllm", "triton")}
    aot = dirs["vllm"] / "torch_compile_cache" / "inductor_cache" / "2l"
    aot.mkdir(parents=True)
    dirs["triton"].mkdir()
    best = aot / "6a59.best_config"
    best.write_text('{"XBLOCK": 64, "num_warps": 4, "time_taken_ms": 12}')
    rel = best.relative_to(dirs["vllm"]).as_posix()
    baked = {"vllm": {rel: hashlib.sha256(best.read_bytes()).hexdigest()}, "triton": {}}
    p = predict(cpu["baseline"], cpu["baseline"], {"vllm", "triton"})
    w = evidence.watcher(dirs, baked)
    w(evidence.PREDICTION_MARK + json.dumps(p.to_json()) + "\n")
    w("INFO Directly load the compiled graph(s) for compile range (1, 16384) from the cache\n")
    best.write_text('{"XBLOCK": 64, "num_warps": 4, "time_taken_ms": 15}')
    message = w("INFO:     Application startup complete.\n")
    assert message is not None
    assert message.startswith("start-up compiled nothing: 0 new files in vllm, triton")
    assert "Inductor benchmarked the launch configs of 1 baked kernels again" in message
    assert "prediction wrong" not in message
    status = w.status()
    assert status["evidence"]["autotune_rebenchmarked"] == {"vllm": 1}  # type: ignore[index]
    assert status["evidence"]["actual"] == {"vllm": "hit", "triton": "hit"}  # type: ignore[index]
    # A new autotune result (none was baked) is a miss as before: its kernel was not baked.
    (aot / "new.best_config").write_text("{}")
    found = evidence.added(w.before, evidence.snapshot(dirs), dirs, baked)
    compiled, again = evidence.split_rebenchmarked(found, w.before)
    assert compiled["vllm"] == {"torch_compile_cache/inductor_cache/2l/new.best_config"}
    assert again["vllm"] == {rel}


def test_the_benchmark_note_is_not_taken_for_a_compile_line() -> None:
    from tests.support import bench

    flow = bench.load("vllm_image_flow")
    text = evidence.startup_report({"vllm": set()}, {"vllm": {"a.best_config"}})
    note = text.splitlines()[1]
    assert "benchmarked the launch configs of 1 baked kernels again" in note
    assert flow.compile_lines([(1.0, note)], 0.0) == []


# -- the engine's own cache_key_factors.json (vLLM 0.34 writes every factor beside its cache) --


def _factors(**env: str) -> dict[str, Any]:
    return {
        "env": {"VLLM_USE_AOT_COMPILE": "1", **env},
        "config": {"model": {"dtype": "bfloat16", "max_model_len": 4096}, "version": "0.34.0"},
        "code": {"files": [{"path": "/x/llama.py", "hash": "c1"}]},
        "compiler": {"inductor": ["sys", "key"]},
        "config_hash": "cfg1",
        "code_hash": "code1",
        "compiler_hash": "comp1",
    }


def _with_engine_factors(doc: dict[str, Any], factors: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["engine_factors"] = {
        "file": "torch_compile_cache/ab12/rank_0_0/backbone/cache_key_factors.json",
        **factors,
    }
    return out


def test_where_the_engine_wrote_its_factors_the_prediction_diffs_those_and_says_so(
    h200: dict[str, Any],
) -> None:
    base = h200["cases"]["baseline"]["identity"]
    changed = _factors(VLLM_FUSED_MOE_CHUNK_SIZE="1024")
    changed["config_hash"] = "cfg2"
    p = predict(
        _with_engine_factors(h200["baked"], _factors()), _with_engine_factors(base, changed), h200["kinds"]
    )
    verdict = p.kind("vllm")
    assert verdict is not None and verdict.outcome is Outcome.MISS
    # Named by the engine's own factor, its hash left out while a factor explains it.
    assert [c.factor for c in verdict.changes] == ["cache_key_factors.env.VLLM_FUSED_MOE_CHUNK_SIZE"]
    assert p.to_json()["factors"] == (
        "engine: torch_compile_cache/ab12/rank_0_0/backbone/cache_key_factors.json"
    )
    assert "vLLM's own cache_key_factors.json" in p.lines()[0]


def test_the_engines_own_factors_win_over_kernelbakes_recorded_ones(h200: dict[str, Any]) -> None:
    # kernelbake's recorded identity differs where the engine's own factors do not: the
    # engine's cache directory is named by its factors, so it finds the baked graphs.
    base = copy.deepcopy(h200["cases"]["baseline"]["identity"])
    base["env"]["factors"]["VLLM_SOMETHING_KERNELBAKE_SAW"] = "1"
    base["env"]["hash"] = "different"
    without = predict(h200["baked"], base, h200["kinds"])
    assert without.kind("vllm").outcome is Outcome.MISS  # type: ignore[union-attr]
    assert without.to_json()["factors"] == "kernelbake: the identity recorded at build"
    p = predict(
        _with_engine_factors(h200["baked"], _factors()), _with_engine_factors(base, _factors()), h200["kinds"]
    )
    assert p.kind("vllm").outcome is Outcome.HIT, p.lines()  # type: ignore[union-attr]


def test_the_baked_factors_file_is_found_under_the_vllm_cache(tmp_path: Path) -> None:
    from kernelbake.runtime.engines.vllm.predict import engine_factors_baked

    assert engine_factors_baked(tmp_path) is None
    for prefix in ("backbone", "eagle_head"):
        d = tmp_path / "torch_compile_cache" / "ab12" / "rank_0_0" / prefix
        d.mkdir(parents=True)
        (d / "cache_key_factors.json").write_text(json.dumps(_factors()))
    found = engine_factors_baked(tmp_path)
    assert found is not None
    assert found["file"] == "torch_compile_cache/ab12/rank_0_0/backbone/cache_key_factors.json"
    assert found["env"] == _factors()["env"]
    (
        tmp_path / "torch_compile_cache" / "ab12" / "rank_0_0" / "backbone" / "cache_key_factors.json"
    ).write_text("{")
    assert engine_factors_baked(tmp_path)["file"].endswith("eagle_head/cache_key_factors.json")  # type: ignore[index]


# -- knobs outside every key (runtime.knobs): debug output and forced recompiles ------------


def _with_knobs(doc: dict[str, Any], **knobs: tuple[str, str, Any]) -> dict[str, Any]:
    """``option=(variable, value set, the option's value)``, as runtime.knobs records them."""
    out = copy.deepcopy(doc)
    from kernelbake.runtime.knobs import effect

    out.setdefault("compile", {})["unkeyed"] = {
        "knobs": {
            option.replace("__", "."): {
                "value": value,
                "vars": {var: val},
                "effect": effect(option.replace("__", ".")).value,
            }
            for option, (var, val, value) in knobs.items()
        },
        "debug_dir": "/torch_compile_debug",
    }
    return out


DEBUG = {"torch._inductor.config.trace__enabled": ("TORCH_COMPILE_DEBUG", "1", True)}
ALWAYS = {"triton.knobs.compilation__always_compile": ("TRITON_ALWAYS_COMPILE", "1", True)}


def test_a_debug_knob_on_the_cpu_build_writes_into_the_inductor_cache_and_compiles_nothing(
    cpu: dict[str, Any],
) -> None:
    # As the CPU build's identity records today: its graphs are Inductor's (AOT compile off).
    baked = {**cpu["baseline"], "graphs": "inductor"}
    now = _with_knobs(baked, **DEBUG)
    p = predict(baked, now, CPU_KINDS)
    verdict = p.kind("inductor")
    assert verdict is not None and verdict.outcome is Outcome.WRITES, p.lines()
    assert [str(c) for c in verdict.changes] == [
        "torch._inductor.config.trace.enabled (TORCH_COMPILE_DEBUG=1): unset → True"
    ]
    assert p.predicted == "writes" and p.hit  # nothing compiles; files appear
    assert p.kind("vllm").outcome is Outcome.HIT  # type: ignore[union-attr]


def test_a_debug_knob_on_the_gpu_writes_where_the_graphs_load(h200: dict[str, Any]) -> None:
    now = _with_knobs(h200["cases"]["baseline"]["identity"], **DEBUG)
    p = predict(h200["baked"], now, h200["kinds"])
    assert p.kind("vllm").outcome is Outcome.WRITES, p.lines()  # type: ignore[union-attr]
    assert p.kind("triton").outcome is Outcome.HIT  # type: ignore[union-attr]


def test_triton_always_compile_bypasses_the_triton_cache_and_names_the_variable(h200: dict[str, Any]) -> None:
    now = _with_knobs(h200["cases"]["baseline"]["identity"], **ALWAYS)
    p = predict(h200["baked"], now, h200["kinds"])
    verdict = p.kind("triton")
    assert verdict is not None and verdict.outcome is Outcome.BYPASSED, p.lines()
    assert "TRITON_ALWAYS_COMPILE=1" in verdict.changes[0].factor
    assert p.predicted == "bypassed" and not p.hit
    # On the CPU build nothing of Triton is baked: the knob changes nothing there.
    assert predict(cpu_doc := _with_knobs({}, **ALWAYS), cpu_doc, CPU_KINDS).hit


def test_a_knob_set_alike_at_build_and_now_or_without_effect_changes_nothing(h200: dict[str, Any]) -> None:
    same = _with_knobs(h200["baked"], **DEBUG)
    assert predict(same, _with_knobs(h200["cases"]["baseline"]["identity"], **DEBUG), h200["kinds"]).hit
    cache_dir = {"triton.knobs.cache__dir": ("TRITON_CACHE_DIR", "/opt/kernelbake/cache/triton", "/x")}
    p = predict(h200["baked"], _with_knobs(h200["cases"]["baseline"]["identity"], **cache_dir), h200["kinds"])
    assert p.predicted == "hit", p.lines()
