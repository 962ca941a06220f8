"""What a serving replica compiled that its build had not, noted as it serves: the batches
during which the engine compiled, as request classes a trusted rebuild can send again
(``kernelbake capture record`` reads the notes; ``contract.record`` says what a class is).

Two halves, joined by a file of compile events that every process of the engine appends to:

- **compiles**: in every process (the model runs in the engine core, or in worker processes:
  vLLM's CPU build starts one even for one rank), each compiler is hooked where its own code says
  it compiles, as soon as its module is imported: Triton's compilation listener
  (``knobs.compilation.listener``, called with ``cache_hit``: a kernel loaded from the baked
  cache is no compile), Inductor's code generation for a graph (``compile_fx.
  fx_codegen_and_compile``, which runs only when its FX graph cache missed) and FlashInfer's JIT
  builds (``jit.core.run_ninja``). DeepGEMM and the TensorRT-LLM kernels build in C++, where no
  hook reaches: their files are still claims, with no class noted for them (``capture record``
  says so).
- **notes**: vLLM's scheduler (in the engine core) is wrapped where it takes a batch's results
  (``update_from_output``): one ``stat`` of the events file per batch; when it grew, the batch
  that just ran, and the one after it (with async scheduling the next batch may already have
  run), is written down as a wave of request classes, with what compiled. The size of the file
  at the first batch is the baseline: what compiled before was the start's. Nothing else is
  done per batch.

A class keeps what selects a kernel and nothing a user wrote: sampling settings, how many
logprobs, prompt logprobs, logit-bias and allowed tokens, the kind of structured output, the
prompt's length; never prompt text or token IDs (made up at replay), schemas, stop strings or
``extra_args``. Everything here is bounded and never stops the engine: a failure is said once on
stderr and serving goes on.

The scheduler module is patched when it is first imported (``after_import``): importing it in
the API server just to patch it would add half a second to every start.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.contract.record import (
    MAX_COMPILED,
    MAX_COMPILED_CHARS,
    MAX_PROMPT_TOKENS,
    MAX_WAVE_REQUESTS,
    MAX_WAVES,
    RequestClass,
)
from kernelbake.runtime.engines.vllm.on_import import after_import

# vLLM's own threshold: a temperature below it samples greedily (vllm/sampling_params.py).
_SAMPLING_EPS = 1e-5
# A noted class generates at most this many tokens at replay: decoding longer compiles nothing
# that a few steps do not.
NOTED_MAX_TOKENS = 16
# Made-up token IDs for logit bias, allowed tokens and the like (inside any real vocabulary).
MADE_UP_FIRST_ID = 100
MAX_MADE_UP_IDS = 1024
# A process stops appending compile events after this many (a kernel recompiling at every step
# must not fill the disk); the notes still see the file grow up to there.
MAX_EVENTS = 4096
# What the scheduler reads of the events file per check.
_READ = 64 << 10
# A structured output of each kind, as small as the kind allows: what compiles is the grammar
# machinery and its bitmask kernel, not the user's schema.
_STRUCTURED = {
    "json": {"json": {"type": "object"}},
    "json_object": {"json_object": True},
    "regex": {"regex": "[0-9]+"},
    "choice": {"choice": ["a", "b"]},
    "grammar": {"grammar": 'root ::= "a" | "b"'},
}


def events_path(notes: Path) -> Path:
    """Where the engine's processes append their compiles, beside the notes."""
    return notes.with_name(notes.name.removesuffix(".jsonl") + ".compiles.jsonl")


def _made_up(count: int) -> list[int]:
    return list(range(MADE_UP_FIRST_ID, MADE_UP_FIRST_ID + min(count, MAX_MADE_UP_IDS)))


def _structured_kind(so: Any) -> str | None:
    if so is None:
        return None
    for kind in ("json", "regex", "choice", "grammar", "json_object"):
        if getattr(so, kind, None):
            return kind
    # structural tags and whatever a later release adds: a JSON object exercises the same path.
    return "json"


def _scalars(params: Any) -> dict[str, Any]:
    body: dict[str, Any] = {}
    temperature = float(getattr(params, "temperature", 1.0))
    body["temperature"] = 0.0 if temperature < _SAMPLING_EPS else round(temperature, 3)
    for name, default in (
        ("top_p", 1.0),
        ("min_p", 0.0),
        ("presence_penalty", 0.0),
        ("frequency_penalty", 0.0),
        ("repetition_penalty", 1.0),
    ):
        value = getattr(params, name, None)
        if value is not None and float(value) != default:
            body[name] = round(float(value), 3)
    if (top_k := getattr(params, "top_k", None)) not in (None, 0, -1):
        body["top_k"] = int(top_k)
    if getattr(params, "seed", None) is not None:
        # Seeded rows sample through other kernels than unseeded ones; the value does not matter.
        body["seed"] = 0
    if getattr(params, "ignore_eos", False):
        body["ignore_eos"] = True
    return body


def request_class(params: Any, prompt_tokens: int) -> RequestClass | None:
    """A served request's class, from its ``SamplingParams`` (None: not a generation request,
    such as pooling, which the completions API cannot replay)."""
    if params is None or not hasattr(params, "temperature"):
        return None
    body = _scalars(params)
    max_tokens = max(1, min(int(getattr(params, "max_tokens", None) or NOTED_MAX_TOKENS), NOTED_MAX_TOKENS))
    body["max_tokens"] = max_tokens
    for name in ("logprobs", "prompt_logprobs"):
        if (value := getattr(params, name, None)) is not None:
            body[name] = int(value)
    if ids := getattr(params, "logprob_token_ids", None):
        body["logprob_token_ids"] = _made_up(len(ids))
        # vLLM's completions API refuses logprob_token_ids without logprobs (HTTP 400), yet
        # hands the engine logprobs=None when it has the IDs (SamplingParams.num_logprobs then
        # counts them): a class noted without it could not be replayed (the H200 capture run
        # of 2026-12-05 lost this class's kernel so). len(ids) is what the sampler uses.
        body.setdefault("logprobs", len(ids))
    if bias := getattr(params, "logit_bias", None):
        body["logit_bias"] = {str(i): 1.0 for i in _made_up(len(bias))}
    if allowed := getattr(params, "allowed_token_ids", None):
        body["allowed_token_ids"] = _made_up(len(allowed))
    if stops := getattr(params, "stop_token_ids", None):
        body["stop_token_ids"] = _made_up(len(stops))
    if (min_tokens := int(getattr(params, "min_tokens", 0) or 0)) > 0:
        body["min_tokens"] = min(min_tokens, max_tokens)
    if bad := getattr(params, "bad_words", None):
        body["bad_words"] = [f"kb{i}" for i in range(min(len(bad), 64))]
    if (kind := _structured_kind(getattr(params, "structured_outputs", None))) is not None:
        body["structured_outputs"] = _STRUCTURED[kind]
    return RequestClass.of(body, max(1, min(int(prompt_tokens), MAX_PROMPT_TOKENS)))


def wave_of(scheduler: Any, scheduler_output: Any) -> dict[RequestClass, int]:
    """The classes of the requests in one scheduled batch, with how many of each."""
    requests: Mapping[str, Any] = getattr(scheduler, "requests", None) or {}
    counts: dict[RequestClass, int] = {}
    total = 0
    for req_id in getattr(scheduler_output, "num_scheduled_tokens", None) or {}:
        request = requests.get(req_id)
        if request is None or total >= MAX_WAVE_REQUESTS:
            continue
        found = request_class(
            getattr(request, "sampling_params", None), getattr(request, "num_prompt_tokens", 1)
        )
        if found is not None:
            counts[found] = counts.get(found, 0) + 1
            total += 1
    return counts


class Compiles:
    """This process's compile events, appended to the file the engine's processes share."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.emitted = 0

    def emit(self, kind: str, name: str, key: str = "") -> None:
        if self.emitted >= MAX_EVENTS:
            return
        self.emitted += 1
        line = json.dumps({"kind": kind, "name": name[:120], "key": key[:80], "pid": os.getpid()}) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # One short write in append mode: processes of one engine do not interleave it.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            _warn(f"cannot note a compile in {self.path}: {exc}")


def _hook_triton(knobs: ModuleType, compiles: Compiles) -> bool:
    previous = knobs.compilation.listener
    if getattr(previous, "kernelbake_compiles", None) is compiles:
        return True

    def listener(*, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
        if not cache_hit:
            meta = metadata if isinstance(metadata, dict) else {}
            compiles.emit("triton", str(getattr(src, "name", "?")), str(meta.get("hash", "")))
        if previous is not None:
            previous(
                src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit
            )

    listener.kernelbake_compiles = compiles  # type: ignore[attr-defined]
    knobs.compilation.listener = listener
    return True


def _wrap(module: ModuleType, attr: str, compiles: Compiles, kind: str, name: Callable[..., str]) -> bool:
    original = getattr(module, attr, None)
    if original is None:
        return False
    if getattr(original, "kernelbake_compiles", None) is compiles:
        return True

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        compiles.emit(kind, name(*args, **kwargs))
        return original(*args, **kwargs)

    wrapper.kernelbake_compiles = compiles  # type: ignore[attr-defined]
    setattr(module, attr, wrapper)
    return True


def _graph(gm: Any = None, *_a: Any, **_k: Any) -> str:
    nodes = getattr(getattr(gm, "graph", None), "nodes", None)
    return f"a graph of {len(nodes)} nodes" if nodes is not None else "a graph"


def _module(workdir: Any = None, *_a: Any, **_k: Any) -> str:
    return Path(str(workdir)).name if workdir is not None else "a module"


# Where each compiler says it compiles: (module, what it is, the hook). Each is hooked when its
# module is imported, in every process of the engine; what compiled before the scheduler's first
# batch (a start's own compiles) is left out by the notes' baseline, not by the hooks.
Hook = Callable[[ModuleType, Compiles], bool]
COMPILERS: tuple[tuple[str, str, Hook], ...] = (
    ("triton.knobs", "Triton's compilation listener", _hook_triton),
    (
        "torch._inductor.compile_fx",
        "Inductor's code generation",
        lambda m, c: _wrap(m, "fx_codegen_and_compile", c, "inductor", _graph),
    ),
    (
        "flashinfer.jit.core",
        "FlashInfer's JIT builds",
        lambda m, c: _wrap(m, "run_ninja", c, "flashinfer", _module),
    ),
)


def hook_compilers(compiles: Compiles) -> None:
    """Each compiler of ``COMPILERS`` hooked in this process once its module is imported (now,
    if it is). Idempotent."""
    for name, what, hook in COMPILERS:
        after_import(name, _hooking(what, hook, compiles))


def _hooking(what: str, hook: Hook, compiles: Compiles) -> Callable[[ModuleType], None]:
    def then(module: ModuleType) -> None:
        _guarded(what, lambda: hook(module, compiles))

    return then


_warned: set[str] = set()


def _warn(text: str) -> None:
    if text not in _warned:
        _warned.add(text)
        print(f"kernelbake: WARNING: {text}; the request classes that compile are not noted", file=sys.stderr)


def _guarded(what: str, hook: Callable[[], bool]) -> bool:
    try:
        if hook():
            return True
        _warn(f"{what} is not where kernelbake looks for it")
    except Exception as exc:
        _warn(f"{what} cannot be hooked ({type(exc).__name__}: {exc})")
    return False


class Notes:
    """The waves noted in this engine (its scheduler's process), appended to ``path``."""

    def __init__(self, path: Path, events: Path) -> None:
        self.path, self.events = path, events
        self.offset: int | None = None  # how much of the events file came before serving
        self.seen: set[str] = set()
        self.pending = False

    def baseline(self) -> None:
        self.offset = _size(self.events)

    def compiled(self) -> list[str] | None:
        """What compiled since the last check (None: nothing), as ``kind name key`` lines."""
        size = _size(self.events)
        if self.offset is None or size <= self.offset:
            return None
        names: list[str] = []
        with contextlib.suppress(OSError), self.events.open("rb") as fh:
            fh.seek(self.offset)
            for raw in fh.read(min(size - self.offset, _READ)).splitlines():
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    e = jsondoc.loads(raw)
                    names.append(" ".join(str(e.get(k, "")) for k in ("kind", "name", "key")).strip())
        self.offset = size
        unique = list(dict.fromkeys(n[:MAX_COMPILED_CHARS] for n in names if n))
        return unique[:MAX_COMPILED] or ["(unnamed)"]

    def after_batch(self, scheduler: Any, scheduler_output: Any) -> None:
        """Called with each batch's results, before the scheduler frees its finished requests."""
        compiled = self.compiled()
        if compiled is None and not self.pending:
            return
        self.pending = compiled is not None
        self.note(wave_of(scheduler, scheduler_output), compiled or [])

    def note(self, wave: Mapping[RequestClass, int], compiled: list[str]) -> None:
        if not wave:
            return
        members = [{**c.to_json(), "copies": n} for c, n in sorted(wave.items(), key=lambda x: x[0].body)]
        key = json.dumps(members, sort_keys=True)
        if key in self.seen or len(self.seen) >= MAX_WAVES:
            return
        self.seen.add(key)
        line = json.dumps({"wave": members, "compiled": compiled, "at": round(time.time(), 1)}) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as fh:
                fh.write(line)
        except OSError as exc:
            _warn(f"cannot write {self.path}: {exc}")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def patch_scheduler(cls: type, notes: Notes) -> None:
    """Wrap ``cls.schedule`` (the first batch sets the baseline: what compiled before it was the
    start's) and ``cls.update_from_output`` (each batch's check). Idempotent."""
    schedule, update = cls.schedule, cls.update_from_output  # type: ignore[attr-defined]
    if getattr(update, "kernelbake_notes", None) is not None:
        return

    def schedule_(self: Any, *args: Any, **kwargs: Any) -> Any:
        if notes.offset is None:
            notes.baseline()
        return schedule(self, *args, **kwargs)

    def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        try:
            notes.after_batch(self, scheduler_output)
        except Exception as exc:  # serving goes on; what is lost is said
            _warn(f"a batch's compiles were not noted ({type(exc).__name__}: {exc})")
        return update(self, scheduler_output, model_runner_output)

    update_from_output.kernelbake_notes = notes  # type: ignore[attr-defined]
    cls.schedule = schedule_  # type: ignore[attr-defined]
    cls.update_from_output = update_from_output  # type: ignore[attr-defined]


_installed: dict[Path, Compiles] = {}


def install(notes_path: Path, scheduler: str) -> Compiles:
    """In a serving vLLM process: its compilers hooked and the scheduler (``module:Class``,
    from the release's adapter) noting batches, each once imported. Once per process."""
    if (done := _installed.get(notes_path)) is not None:
        return done
    compiles = _installed[notes_path] = Compiles(events_path(notes_path))
    notes = Notes(notes_path, compiles.path)
    module, _, attr = scheduler.partition(":")
    hook_compilers(compiles)

    def patch(found: ModuleType) -> None:
        _guarded(f"vLLM's scheduler ({scheduler})", lambda: _patch(found, attr, notes))

    after_import(module, patch)
    return compiles


def _patch(module: ModuleType, attr: str, notes: Notes) -> bool:
    cls = getattr(module, attr, None)
    if cls is None:
        return False
    patch_scheduler(cls, notes)
    return True
