"""A serving engine notes what it compiled, as it serves (issue 42, second round, item 1): the
batches during which a compiler wrote something, as request classes a rebuild can send again,
never prompt text, token IDs, schemas or secrets; bounded, and never in the way of serving.
vLLM's scheduler, Triton, Inductor and FlashInfer are stand-ins here with the names and
signatures the 0.26/0.32/0.34 adapters list (compat_layer.HOOKS, checked against the wheels)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from kernelbake.contract.record import MAX_WAVES, RequestClass, made_up_prompt
from kernelbake.runtime.engines.vllm import misses, on_import

DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "seed": None,
    "max_tokens": 16,
    "min_tokens": 0,
    "logprobs": None,
    "prompt_logprobs": None,
    "logprob_token_ids": None,
    "logit_bias": None,
    "allowed_token_ids": None,
    "stop_token_ids": None,
    "bad_words": None,
    "ignore_eos": False,
    "structured_outputs": None,
    "stop": None,
    "extra_args": None,
}


def params(**kw: Any) -> types.SimpleNamespace:
    """vLLM's ``SamplingParams`` as a served request carries them."""
    return types.SimpleNamespace(**{**DEFAULTS, **kw})


def request(p: types.SimpleNamespace, prompt_tokens: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(sampling_params=p, num_prompt_tokens=prompt_tokens)


def test_a_class_keeps_what_selects_a_kernel_and_nothing_a_user_wrote() -> None:
    schema = types.SimpleNamespace(
        json={"properties": {"password": {"const": "hunter2"}}}, regex=None, choice=None, grammar=None
    )
    found = misses.request_class(
        params(
            temperature=0.7,
            top_k=3,
            logprobs=20,
            seed=1234,
            stop=["the secret stop"],
            logit_bias={31337: 2.0, 42: -1.0},
            allowed_token_ids=[5, 6, 7],
            structured_outputs=schema,
            extra_args={"api_key": "s3cret"},
            max_tokens=500,
            min_tokens=400,
        ),
        37,
    )
    assert found is not None and found.prompt_tokens == 37 and found.problem() is None
    assert json.loads(found.body) == {
        "temperature": 0.7,
        "top_k": 3,
        "logprobs": 20,
        "seed": 0,
        "max_tokens": misses.NOTED_MAX_TOKENS,
        "min_tokens": misses.NOTED_MAX_TOKENS,
        "logit_bias": {"100": 1.0, "101": 1.0},
        "allowed_token_ids": [100, 101, 102],
        "structured_outputs": {"json": {"type": "object"}},
    }
    for secret in ("secret", "31337", "password", "hunter2", "s3cret", "1234"):
        assert secret not in found.body
    greedy = misses.request_class(params(temperature=1e-6, prompt_logprobs=3), 5)
    assert greedy is not None and json.loads(greedy.body) == {
        "temperature": 0.0,
        "max_tokens": 16,
        "prompt_logprobs": 3,
    }
    assert misses.request_class(None, 5) is None, "pooling: nothing the completions API replays"


def test_a_class_with_logprob_token_ids_is_one_the_completions_api_accepts() -> None:
    # vLLM's completions layer passes logprobs=None to SamplingParams when the request names
    # token IDs, but refuses a request with the IDs and no logprobs (HTTP 400): the H200
    # capture run of 2026-12-05 lost this class's kernel in the rebuild because of it.
    served = misses.request_class(params(temperature=0.0, logprob_token_ids=[7, 8, 9, 10, 11]), 24)
    assert served is not None and served.problem() is None
    body = json.loads(served.body)
    assert body["logprob_token_ids"] == [100, 101, 102, 103, 104]
    assert body["logprobs"] == 5, "the count the sampler uses (SamplingParams.num_logprobs)"
    both = misses.request_class(params(logprobs=5, logprob_token_ids=[7, 8, 9, 10, 11]), 24)
    assert both is not None and json.loads(both.body)["logprobs"] == 5


class Scheduler:
    """vLLM's V1 scheduler as misses.py sees it: ``requests`` by id, and the two methods."""

    def __init__(self, requests: dict[str, types.SimpleNamespace]) -> None:
        self.requests = requests
        self.updated = 0

    def schedule(self, throttle_prefills: bool = False) -> str:
        return "scheduled"

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> dict[int, Any]:
        # vLLM frees the finished requests in here: misses.py must have read them before.
        self.updated += 1
        for req_id in scheduler_output.finished:
            self.requests.pop(req_id)
        return {0: model_runner_output}


def batch(*ids: str, finished: tuple[str, ...] = ()) -> types.SimpleNamespace:
    return types.SimpleNamespace(num_scheduled_tokens={i: 1 for i in ids}, finished=finished)


def _notes(tmp_path: Path) -> tuple[type[Scheduler], misses.Compiles, Path]:
    path = tmp_path / "scratch" / "kernelbake-misses.jsonl"
    compiles = misses.Compiles(misses.events_path(path))
    cls = type("PatchedScheduler", (Scheduler,), {})
    misses.patch_scheduler(cls, misses.Notes(path, compiles.path))
    misses.patch_scheduler(cls, misses.Notes(path, compiles.path))  # a second register(): no-op
    return cls, compiles, path


def _waves(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_batch_that_compiled_and_the_next_are_noted_with_what_compiled(tmp_path: Path) -> None:
    cls, compiles, path = _notes(tmp_path)
    logprobs20, greedy = params(temperature=0.7, logprobs=20), params(temperature=0.0)
    s = cls({"a": request(logprobs20, 30), "b": request(logprobs20, 30), "c": request(greedy, 7)})
    compiles.emit("triton", "a kernel of the warm-up")  # before the first batch: the start's
    assert s.schedule() == "scheduled"
    assert s.update_from_output(batch("c"), "out") == {0: "out"}
    assert _waves(path) == []
    s.schedule()
    compiles.emit("triton", "_topk_log_softmax_kernel", "5f2c")
    s.update_from_output(batch("a", "b", "c", finished=("c",)), "out")
    s.update_from_output(batch("a", "b"), "out")  # the batch after, as async scheduling runs it
    s.update_from_output(batch("a", "b"), "out")
    compiles.emit("inductor", "a graph of 3 nodes")
    s.update_from_output(batch("a", "b", finished=("a", "b")), "out")  # the same wave: once
    first, after = _waves(path)
    assert first["compiled"] == ["triton _topk_log_softmax_kernel 5f2c"] and after["compiled"] == []
    members = {
        json.dumps(m["body"], sort_keys=True): (m["prompt_tokens"], m["copies"]) for m in first["wave"]
    }
    assert members == {
        '{"logprobs": 20, "max_tokens": 16, "temperature": 0.7}': (30, 2),
        '{"max_tokens": 16, "temperature": 0.0}': (7, 1),
    }
    assert [m["copies"] for m in after["wave"]] == [2] and s.updated == 5


def test_notes_are_bounded_and_never_stop_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cls, compiles, path = _notes(tmp_path)
    s = cls({str(n): request(params(top_k=n + 1), 4) for n in range(MAX_WAVES + 5)})
    s.schedule()
    for n in range(MAX_WAVES + 5):
        compiles.emit("triton", f"k{n}")
        s.update_from_output(batch(str(n)), None)
    assert len(_waves(path)) == MAX_WAVES
    monkeypatch.setattr(misses.Notes, "after_batch", lambda *_a: 1 / 0)
    assert s.update_from_output(batch("0"), "still served") == {0: "still served"}
    assert "a batch's compiles were not noted (ZeroDivisionError" in capsys.readouterr().err
    many = misses.Compiles(tmp_path / "many.jsonl")
    for _ in range(misses.MAX_EVENTS + 10):
        many.emit("triton", "again")
    assert len((tmp_path / "many.jsonl").read_text().splitlines()) == misses.MAX_EVENTS


def test_the_compilers_are_hooked_where_their_own_code_says_a_compile_happens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    heard: list[bool] = []
    knobs = types.ModuleType("triton.knobs")
    knobs.compilation = types.SimpleNamespace(listener=lambda **kw: heard.append(kw["cache_hit"]))  # type: ignore[attr-defined]
    fx = types.ModuleType("torch._inductor.compile_fx")
    fx.fx_codegen_and_compile = lambda gm, *a, **k: "compiled graph"  # type: ignore[attr-defined]
    jit = types.ModuleType("flashinfer.jit.core")
    monkeypatch.setitem(sys.modules, "triton.knobs", knobs)
    monkeypatch.setitem(sys.modules, "torch._inductor.compile_fx", fx)
    monkeypatch.setitem(sys.modules, "flashinfer.jit.core", jit)
    compiles = misses.Compiles(tmp_path / "c.jsonl")
    misses.hook_compilers(compiles)
    misses.hook_compilers(compiles)  # a second time wraps nothing twice
    assert "FlashInfer's JIT builds is not where kernelbake looks for it" in capsys.readouterr().err
    src = types.SimpleNamespace(name="_topk_log_softmax_kernel")
    for hit in (True, False):
        knobs.compilation.listener(
            src=src, metadata={"hash": "5f2c"}, metadata_group={}, times=None, cache_hit=hit
        )
    gm = types.SimpleNamespace(graph=types.SimpleNamespace(nodes=[1, 2, 3]))
    assert fx.fx_codegen_and_compile(gm, [], inner=1) == "compiled graph"
    events = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["name"], e["key"]) for e in events] == [
        ("triton", "_topk_log_softmax_kernel", "5f2c"),
        ("inductor", "a graph of 3 nodes", ""),
    ], "a kernel Triton loaded from the baked cache is no compile"
    assert heard == [True, False], "the listener that was there still hears every call"


def test_the_scheduler_and_compilers_are_patched_when_imported_not_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "kb_fake_vllm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "sched.py").write_text(
        "class Scheduler:\n"
        "    def schedule(self, throttle_prefills=False):\n        return 'scheduled'\n"
        "    def update_from_output(self, scheduler_output, model_runner_output):\n        return {}\n"
    )
    (package / "compile_fx.py").write_text("def fx_codegen_and_compile(gm, *a, **k):\n    return 'graph'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(misses, "_installed", {})
    monkeypatch.setattr(
        misses, "COMPILERS", (("kb_fake_vllm.compile_fx", "a compiler", misses.COMPILERS[1][2]),)
    )
    notes = tmp_path / "scratch" / "kernelbake-misses.jsonl"
    compiles = misses.install(notes, "kb_fake_vllm.sched:Scheduler")
    assert misses.install(notes, "kb_fake_vllm.sched:Scheduler") is compiles, "once per process"
    assert "kb_fake_vllm.sched" not in sys.modules, "nothing is imported to patch it"
    from kb_fake_vllm import compile_fx, sched  # type: ignore[import-not-found]

    for name in ("kb_fake_vllm", "kb_fake_vllm.sched", "kb_fake_vllm.compile_fx"):
        monkeypatch.delitem(sys.modules, name)
    assert sched.Scheduler.update_from_output.kernelbake_notes.path == notes
    assert Path(sched.__file__).parent == package
    assert compile_fx.fx_codegen_and_compile(None) == "graph"
    assert json.loads(compiles.path.read_text())["kind"] == "inductor"
    assert not any(isinstance(f, on_import._AfterImport) for f in sys.meta_path)


def test_a_noted_class_is_replayed_with_a_made_up_prompt_of_its_length() -> None:
    cls = RequestClass.of({"max_tokens": 4, "logprobs": 20}, prompt_tokens=5)
    prompts = [made_up_prompt(5, salt) for salt in range(3)]
    assert all(len(p) == 5 and min(p) >= 100 for p in prompts)
    assert len({p[0] for p in prompts}) == 3, "no two share a prefix for the prefix cache to skip"
    assert cls.problem() is None


def test_a_hook_that_breaks_leaves_the_module_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "kb_fake_broken_hook.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    on_import.after_import("kb_fake_broken_hook", lambda m: 1 / 0)
    import kb_fake_broken_hook  # type: ignore[import-not-found]

    monkeypatch.delitem(sys.modules, "kb_fake_broken_hook")
    assert kb_fake_broken_hook.VALUE == 1
    assert "after importing kb_fake_broken_hook: ZeroDivisionError" in capsys.readouterr().err
