"""The traffic a server meets right after ``/health``: a mix of request classes over vLLM's
OpenAI completions API, sequential and concurrent, to show whether anything still compiles
once the server says it is ready (bench/vllm_image_flow.py counts the files each cache
directory gains and the compile lines the server logs meanwhile).

Classes (``classes``): greedy and sampled (temperature, top-p, top-k, min-p, presence,
frequency and repetition penalties, seed), ``n > 1``, logprobs and prompt logprobs, stop
conditions (stop token, min tokens, ignore EOS), logit bias and allowed tokens, prompts from
1 token to near ``max_model_len`` (chunked prefill past ``max_num_batched_tokens``), and
structured output when the server has a tokenizer. Prompts are token IDs, so a server
started with ``--skip-tokenizer-init`` takes them; logprobs then come back as
``token_id:N`` (``return_tokens_as_token_ids``).

Order (``plan``): each class once, alone, in turn (its latency is that class's first
request), then concurrent waves of 1, 2, 4, … ``max_num_seqs`` requests cycling through the
classes, then sequential requests until ``total`` is reached. This module is stdlib only and
talks HTTP: tests run it against a fake server.

The classes match those of the build's request warm-up
(``kernelbake.runtime.engines.vllm.warmup``), but their values do not (prompt lengths,
sampling values, seeds, the token IDs drawn): on purpose, so that the mix shows the warm-up
covers each class of request, not only the exact requests it sent.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

MAX_TOKENS = 8
_FIRST_ID = 100
_SPAN = 30000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    kind: str
    phase: str  # "first" (each class alone), "concurrent", "sequential"
    wave: int
    prompt_len: int
    params: tuple[tuple[str, Any], ...]


def classes(
    *, max_model_len: int, max_num_batched_tokens: int, tokenizer: bool
) -> dict[str, tuple[int, dict[str, Any]]]:
    """Request class → (prompt length in tokens, completion request fields)."""
    near_max = max(1, max_model_len - MAX_TOKENS - 1)
    chunked = min(max_num_batched_tokens + 17, near_max)
    sampled: dict[str, Any] = {"temperature": 0.7, "seed": 11}
    token = _FIRST_ID + 5
    out: dict[str, tuple[int, dict[str, Any]]] = {
        "greedy_1_token": (1, {"temperature": 0.0}),
        "greedy_short": (24, {"temperature": 0.0}),
        "greedy_medium": (700, {"temperature": 0.0}),
        "greedy_chunked_prefill": (chunked, {"temperature": 0.0}),
        "greedy_near_max_model_len": (near_max, {"temperature": 0.0}),
        "sampled_temperature": (40, dict(sampled)),
        "sampled_top_p": (40, {**sampled, "top_p": 0.8}),
        "sampled_top_k": (40, {**sampled, "top_k": 10}),
        "sampled_top_k_top_p": (40, {**sampled, "top_k": 30, "top_p": 0.9}),
        "sampled_min_p": (40, {**sampled, "min_p": 0.1}),
        "sampled_penalties": (
            56,
            {**sampled, "presence_penalty": 0.4, "frequency_penalty": 0.6, "repetition_penalty": 1.2},
        ),
        "sampled_everything": (
            56,
            {
                **sampled,
                "top_k": 64,
                "top_p": 0.95,
                "min_p": 0.03,
                "presence_penalty": 0.2,
                "frequency_penalty": 0.2,
                "repetition_penalty": 1.1,
            },
        ),
        "n_3": (30, {**sampled, "n": 3}),
        "logprobs": (30, {"temperature": 0.0, "logprobs": 4}),
        "prompt_logprobs": (90, {"temperature": 0.0, "prompt_logprobs": 3}),
        "logprobs_sampled_n2": (30, {**sampled, "top_p": 0.9, "n": 2, "logprobs": 2, "prompt_logprobs": 1}),
        "stop_token_min_tokens": (20, {"temperature": 0.0, "stop_token_ids": [token], "min_tokens": 3}),
        "ignore_eos": (20, {"temperature": 0.0, "ignore_eos": True}),
        "logit_bias": (20, {**sampled, "logit_bias": {str(token): 4.0}}),
        "allowed_token_ids": (20, {**sampled, "allowed_token_ids": list(range(_FIRST_ID, _FIRST_ID + 50))}),
    }
    if tokenizer:
        out["structured_choice"] = (20, {"temperature": 0.0, "structured_outputs": {"choice": ["yes", "no"]}})
        out["structured_json"] = (
            20,
            {
                "temperature": 0.0,
                "structured_outputs": {
                    "json": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
                },
            },
        )
        out["stop_string"] = (20, {"temperature": 0.0, "stop": ["\n"]})
    return out


def batch_sizes(max_num_seqs: int) -> list[int]:
    sizes, size = [], 1
    while size < max_num_seqs:
        sizes.append(size)
        size *= 2
    return [*sizes, max_num_seqs]


def plan(
    *, max_model_len: int, max_num_seqs: int, max_num_batched_tokens: int, tokenizer: bool, total: int = 200
) -> list[list[Request]]:
    """Waves of requests; one wave is sent at once and finishes before the next starts."""
    table = classes(
        max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens, tokenizer=tokenizer
    )
    names = list(table)

    def req(kind: str, phase: str, wave: int) -> Request:
        length, params = table[kind]
        return Request(
            kind=kind,
            phase=phase,
            wave=wave,
            prompt_len=length,
            params=tuple(sorted({"max_tokens": MAX_TOKENS, **params}.items())),
        )

    waves = [[req(k, "first", i)] for i, k in enumerate(names)]
    i = 0
    for size in batch_sizes(max_num_seqs):
        waves.append([req(names[(i + j) % len(names)], "concurrent", len(waves)) for j in range(size)])
        i += size
    count = sum(len(w) for w in waves)
    while count < total:
        waves.append([req(names[i % len(names)], "sequential", len(waves))])
        i += 1
        count += 1
    return waves


def vocab_size(model: str) -> int | None:
    """``vocab_size`` of the model's ``config.json`` (a local path), or None."""
    try:
        found = json.loads((Path(model) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, int) and found > 0 else None


def prompt(length: int, salt: int, vocab: int | None = None) -> list[int]:
    """Token IDs; ``salt`` keeps prompts apart so prefix caching cannot skip a prefill. Drawn
    from 30,000 IDs, fewer where the model's vocabulary is smaller (the CPU image's model has
    4,096, and vLLM refuses an ID out of it); the GPU models' prompts are unchanged by it."""
    span = _SPAN if vocab is None else max(1, min(_SPAN, vocab - _FIRST_ID))
    return [_FIRST_ID + (salt * 7919 + k * 31) % span for k in range(length)]


def body(request: Request, model: str, salt: int, vocab: int | None = None) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt(request.prompt_len, salt, vocab),
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        **dict(request.params),
    }


def _send(url: str, doc: dict[str, Any], timeout: float) -> tuple[int, dict[str, Any] | str]:
    data = json.dumps(doc).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:300]
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return 0, f"{type(exc).__name__}: {exc}"[:300]


def run(
    base_url: str,
    model: str,
    waves: list[list[Request]],
    *,
    timeout: float = 300.0,
    vocab: int | None = None,
) -> dict[str, Any]:
    """Sends ``waves`` to ``base_url``; returns one record per request and, per class, the
    latency of its first request (sent alone) and its count of failures. ``vocab``: the
    model's vocabulary size, which bounds the prompts' token IDs."""
    url = base_url.rstrip("/") + "/v1/completions"
    records: list[dict[str, Any]] = []
    salt = 0
    started = time.monotonic()

    def one(request: Request, salt_: int) -> dict[str, Any]:
        t0 = time.monotonic()
        status, answer = _send(url, body(request, model, salt_, vocab), timeout)
        record: dict[str, Any] = {
            "kind": request.kind,
            "phase": request.phase,
            "wave": request.wave,
            "prompt_len": request.prompt_len,
            "status": status,
            "latency_s": round(time.monotonic() - t0, 3),
        }
        if status == 200 and isinstance(answer, dict):
            choices = answer.get("choices") or []
            record["choices"] = len(choices)
            record["tokens"] = [len(c.get("token_ids") or []) for c in choices]
        else:
            record["error"] = answer
        return record

    with ThreadPoolExecutor(max_workers=max(len(w) for w in waves)) as pool:
        for wave in waves:
            futures = []
            for request in wave:
                futures.append(pool.submit(one, request, salt))
                salt += 1
            records.extend(f.result() for f in futures)
    return {"wall_s": round(time.monotonic() - started, 2), **summarize(records), "records": records}


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    first: dict[str, float] = {}
    failed: dict[str, int] = {}
    for r in records:
        if r["phase"] == "first":
            first[r["kind"]] = r["latency_s"]
        if r["status"] != 200:
            failed[r["kind"]] = failed.get(r["kind"], 0) + 1
    concurrent = [r for r in records if r["phase"] == "concurrent"]
    return {
        "requests": len(records),
        "ok": sum(1 for r in records if r["status"] == 200),
        "failed_per_class": failed,
        "first_request_latency_s": first,
        "concurrent_batch_sizes": sorted(
            {sum(1 for c in concurrent if c["wave"] == w) for w in {c["wave"] for c in concurrent}}
        ),
        "max_prompt_len": max((r["prompt_len"] for r in records), default=0),
        "errors": sorted({str(r.get("error"))[:200] for r in records if r["status"] != 200})[:10],
    }
