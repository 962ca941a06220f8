"""The requests compile-only serves once vLLM is up, so that the kernels a first request of
each kind needs are compiled in the build, not after ``/health``.

vLLM's own start-up runs one dummy batch per CUDA-graph size and a greedy sampler pass. What
it leaves out is what real traffic turns on: sampling parameters (top-k, top-p, min-p,
penalties, seeds, logit bias, allowed tokens), several samples per prompt, logprobs and
prompt logprobs, stop conditions, prompts from one token to near ``max_model_len`` (chunked
prefill once a prompt is longer than ``max_num_batched_tokens``) and every batch size up to
``max_num_seqs``. Each turns on a kernel variant (a Triton specialisation, a FlashInfer
module) that is otherwise compiled by the first user who sends it.

The plan is pure data (``plan``), so it is tested without vLLM; ``serve`` feeds it to an
in-process ``LLMEngine``. Token IDs only: the bench models ship no tokenizer, and structured
output (which needs one) is left out.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

# Short enough to keep the build quick, long enough to pass through decode and the
# penalties' output-token bookkeeping.
MAX_TOKENS = 6
# Token IDs the prompts are drawn from: inside any real vocabulary, away from ID 0.
_FIRST_ID = 100


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmRequest:
    """One request: its class, prompt length and ``SamplingParams`` keyword arguments."""

    kind: str
    prompt_len: int
    params: tuple[tuple[str, Any], ...]

    def sampling_kwargs(self) -> dict[str, Any]:
        return dict(self.params)


def _classes(
    max_model_len: int, max_num_batched_tokens: int, vocab: int
) -> dict[str, tuple[int, dict[str, Any]]]:
    """Request class → (prompt length, sampling parameters)."""
    long_len = max(1, max_model_len - 2 * MAX_TOKENS)
    chunk = min(max_num_batched_tokens + 1, long_len)
    sampled = {"temperature": 0.8, "seed": 7}
    token = min(vocab - 1, _FIRST_ID + 11)
    return {
        "greedy_1_token": (1, {"temperature": 0.0}),
        "greedy_short": (16, {"temperature": 0.0}),
        "greedy_chunked": (chunk, {"temperature": 0.0}),
        "greedy_near_max_len": (long_len, {"temperature": 0.0}),
        "sampled_plain": (32, dict(sampled)),
        "sampled_top_k": (32, {**sampled, "top_k": 20}),
        "sampled_top_p": (32, {**sampled, "top_p": 0.9}),
        "sampled_top_k_top_p": (32, {**sampled, "top_k": 40, "top_p": 0.95}),
        "sampled_min_p": (32, {**sampled, "min_p": 0.05}),
        "penalties": (
            48,
            {**sampled, "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1},
        ),
        "all_sampling": (
            48,
            {
                **sampled,
                "top_k": 50,
                "top_p": 0.9,
                "min_p": 0.02,
                "presence_penalty": 0.3,
                "frequency_penalty": 0.3,
                "repetition_penalty": 1.05,
            },
        ),
        "n_4": (24, {**sampled, "n": 4}),
        "logprobs": (24, {"temperature": 0.0, "logprobs": 5}),
        "prompt_logprobs": (64, {"temperature": 0.0, "prompt_logprobs": 5}),
        "logprobs_sampled": (24, {**sampled, "top_p": 0.9, "logprobs": 3, "prompt_logprobs": 1}),
        "stop_token": (16, {"temperature": 0.0, "stop_token_ids": [token], "min_tokens": 2}),
        "ignore_eos": (16, {"temperature": 0.0, "ignore_eos": True}),
        "logit_bias": (16, {**sampled, "logit_bias": {token: 5.0}}),
        "allowed_token_ids": (16, {**sampled, "allowed_token_ids": list(range(_FIRST_ID, _FIRST_ID + 64))}),
    }


# The classes whose batches pick one Triton top-k/top-p variant each (seeded: no FlashInfer).
SAMPLER_VARIANTS = ("sampled_top_k", "sampled_top_p", "sampled_top_k_top_p")


def batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, … and ``max_num_seqs`` itself: the batch sizes the plan runs concurrently."""
    sizes, size = [], 1
    while size < max_num_seqs:
        sizes.append(size)
        size *= 2
    return [*sizes, max_num_seqs]


def plan(
    *, max_model_len: int, max_num_seqs: int, max_num_batched_tokens: int, vocab: int
) -> list[list[WarmRequest]]:
    """Waves of requests, each wave submitted at once: every class alone first (a first
    request meets an idle engine), then batches of each size in ``batch_sizes`` that cycle
    through the short classes (prompts near ``max_model_len`` stay in the waves of their
    own: one of them fills the engine's token budget)."""
    classes = _classes(max_model_len, max_num_batched_tokens, vocab)

    def request(kind: str) -> WarmRequest:
        length, params = classes[kind]
        return WarmRequest(
            kind=kind, prompt_len=length, params=tuple(sorted({"max_tokens": MAX_TOKENS, **params}.items()))
        )

    waves = [[request(kind)] for kind in classes]
    short = [k for k, (length, _p) in classes.items() if length <= 64]
    for size in batch_sizes(max_num_seqs):
        waves.append([request(short[i % len(short)]) for i in range(size)])
    # Seeded requests sample through vLLM's Triton top-k/top-p kernel once a batch has 8 rows
    # or more, one variant per filter set in the batch (top-k, top-p, both) and per batch-size
    # divisibility by 16. Mixed batches only reach "both": seen on the H200 (FP8 MoE), the
    # top-p-only variant was compiled after /health.
    for kind in SAMPLER_VARIANTS:
        for size in (n for n in (8, 9, 16) if n <= max_num_seqs):
            waves.append([request(kind)] * size)
    return waves


def prompt(length: int, salt: int, vocab: int) -> list[int]:
    """Token IDs of a prompt; ``salt`` keeps prompts apart so prefix caching does not skip
    the prefill a first request of that class would run."""
    span = max(1, min(vocab, 32000) - _FIRST_ID)
    return [_FIRST_ID + (salt * 7919 + i * 31) % span for i in range(length)]


def serve(engine: Any, waves: Sequence[Sequence[WarmRequest]], vocab: int) -> dict[str, Any]:
    """Runs ``waves`` through an in-process vLLM ``LLMEngine``, one wave at a time; returns
    what ran (counts per class, seconds per wave)."""
    from kernelbake.runtime.engines.vllm.compat_layer import lookups

    sampling_params = lookups().sampling_params_class()
    counts: dict[str, int] = {}
    # A class this vLLM refuses (its own validation) is left out and named: the bake goes
    # on, and the serve-time check (files added after /health) shows what that costs.
    refused: dict[str, str] = {}
    seconds: list[float] = []
    n = 0
    for wave in waves:
        t0 = time.monotonic()
        for req in wave:
            if req.kind in refused:
                continue
            kwargs: Mapping[str, Any] = {**req.sampling_kwargs(), "detokenize": False}
            try:
                engine.add_request(
                    f"kernelbake-warmup-{n}",
                    {"prompt_token_ids": prompt(req.prompt_len, n, vocab)},
                    sampling_params(**kwargs),
                )
            except (ValueError, TypeError) as exc:
                refused[req.kind] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            counts[req.kind] = counts.get(req.kind, 0) + 1
            n += 1
        while engine.has_unfinished_requests():
            engine.step()
        seconds.append(round(time.monotonic() - t0, 2))
    return {"requests": n, "per_class": counts, "refused": refused, "wave_s": seconds}
