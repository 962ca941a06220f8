"""The capture record: what a replica compiled that its image's build had not, for a trusted
build to compile again (``kernelbake capture record`` writes it, ``capture rebuild`` replays it).

A record holds no bytes anyone runs. It names:

- ``requests``: the request classes that missed the baked caches, as completion request bodies.
  A class ``serve`` noted as it compiled (``source: served``) has no prompt: its
  ``prompt_tokens`` says how long one was, and the replay makes up that many token IDs; the
  body keeps only what selects a kernel (sampling settings, logprob counts, the kind of
  structured output), never prompt text, token IDs, schemas or stop strings. A class the
  operator gave (``--request``) is replayed as given;
- ``waves``: the batches to send, each a list of (class, copies) sent at once, because what
  compiled may depend on the batch as much as on one request (a sampler kernel specialised on
  how many rows it has); with what the replica's engine said compiled during it;
- ``claims``: the files the replica's cache root gained, per kind with the engine's own keys
  (``contract.delta.engine_key``), path, size and sha256. They are the replica's word, compared
  with what the rebuild produces (how deterministic each kind is), never copied;
- ``key`` and ``base_manifest``: the image it was recorded on, which the rebuild must run.

Everything in a record is untrusted input (anything that can write into a replica's scratch
folder wrote the notes it is made from): bounded here, and replayed only inside the image,
without network.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.contract.delta import DeltaFile, check, files_of, kinds_json
from kernelbake.contract.delta import DeltaManifest as _Shape
from kernelbake.contract.key import CacheKey, parse_key
from kernelbake.errors import BadInput

SCHEMA = 2
RECORD = "record.json"
# A record is replayed wave by wave on a builder: a few classes, each small, a few batches.
MAX_REQUESTS = 64
MAX_WAVES = 64
# One wave is one batch: as many requests as a server batches (vLLM's max_num_seqs default).
MAX_WAVE_REQUESTS = 256
MAX_REQUEST_BYTES = 64 << 10
MAX_RECORD_BYTES = 32 << 20
# The rebuild serves each class once; a long generation compiles nothing a short one does not.
MAX_TOKENS = 256
# A made-up prompt at most this long (a long-context model's max_model_len), and at most this
# many made-up tokens in one wave (what a builder holds in memory to send it).
MAX_PROMPT_TOKENS = 1 << 17
MAX_WAVE_PROMPT_TOKENS = 1 << 21
# Made-up prompts are token IDs from here on (inside any real vocabulary, away from special
# tokens), each request its own sequence, so that prefix caching never skips a prefill.
PROMPT_FIRST_ID = 100
_PROMPT_SPAN = 1000
# What the engine said compiled during a wave: a few names, each short.
MAX_COMPILED = 16
MAX_COMPILED_CHARS = 160


class InvalidRecord(BadInput, ValueError):
    """A capture record that is malformed or over its bounds; the message names the field."""


# Schema 1 (before serve noted classes) is still read (``_parse_requests``).
DOCUMENT = jsondoc.Kind("capture record", (1, SCHEMA), MAX_RECORD_BYTES, InvalidRecord)


class WaveSource(enum.Enum):
    # Noted by ``serve`` in the replica: a batch during which the engine compiled.
    SERVED = "served"
    # Given by the operator to ``capture record --request``.
    OPERATOR = "operator"


def request_problem(body: Any, *, made_up_prompt: bool = False) -> str | None:
    """Why ``body`` cannot be replayed as a request class, or None. ``made_up_prompt``: the
    replay makes up the prompt, so the body must not carry one."""
    if not isinstance(body, dict):
        return f"a request is a JSON object (a completion request's body), not {type(body).__name__}"
    if len(json.dumps(body)) > MAX_REQUEST_BYTES:
        return f"a request is at most {MAX_REQUEST_BYTES} B of JSON"
    tokens = body.get("max_tokens", 16)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or not 0 < tokens <= MAX_TOKENS:
        return f"max_tokens {tokens!r} is not an integer from 1 to {MAX_TOKENS}"
    if body.get("stream") not in (None, False):
        return "stream must be false or absent (the rebuild reads whole answers)"
    if made_up_prompt and "prompt" in body:
        return "a class noted by serve carries no prompt (prompt_tokens says how long one was)"
    if not made_up_prompt and "prompt" not in body:
        return "a request needs a prompt (a class noted by serve has prompt_tokens instead)"
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RequestClass:
    # Canonical JSON of the body, without ``model``: hashable, one encoding for one record.
    body: str
    # Above 0: the body has no prompt, and the replay sends this many made-up token IDs.
    prompt_tokens: int = 0

    @classmethod
    def of(cls, body: Any, prompt_tokens: Any = 0) -> RequestClass:
        return cls(body=json.dumps(body, sort_keys=True, separators=(",", ":")), prompt_tokens=prompt_tokens)

    def problem(self) -> str | None:
        tokens = self.prompt_tokens
        if not isinstance(tokens, int) or isinstance(tokens, bool) or not 0 <= tokens <= MAX_PROMPT_TOKENS:
            return f"prompt_tokens {tokens!r} is not an integer from 0 to {MAX_PROMPT_TOKENS}"
        return request_problem(json.loads(self.body), made_up_prompt=tokens > 0)

    def to_json(self) -> dict[str, Any]:
        return {"body": json.loads(self.body), "prompt_tokens": self.prompt_tokens}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Wave:
    """One batch to send at once: (index into the record's ``requests``, copies) pairs."""

    requests: tuple[tuple[int, int], ...]
    source: WaveSource
    compiled: tuple[str, ...] = ()

    def problem(self, classes: int) -> str | None:
        if not self.requests:
            return "a wave sends at least one request"
        for index, copies in self.requests:
            if not all(isinstance(n, int) and not isinstance(n, bool) for n in (index, copies)):
                return "each of a wave's requests is [class index, copies], two integers"
            if not 0 <= index < classes:
                return f"class {index} is not in the record's {classes} requests"
            if copies < 1:
                return f"copies {copies} of class {index}: at least 1"
        if (total := sum(c for _, c in self.requests)) > MAX_WAVE_REQUESTS:
            return f"{total} requests in one wave, more than {MAX_WAVE_REQUESTS}"
        if len(self.compiled) > MAX_COMPILED or any(len(c) > MAX_COMPILED_CHARS for c in self.compiled):
            return f"compiled: at most {MAX_COMPILED} names of at most {MAX_COMPILED_CHARS} characters"
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": [list(r) for r in self.requests],
            "source": self.source.value,
            "compiled": list(self.compiled),
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaptureRecord:
    key: CacheKey
    base_manifest: str  # sha256:… of the pinned cache manifest of the image recorded on
    replica: str
    requests: tuple[RequestClass, ...]
    waves: tuple[Wave, ...]
    claims: tuple[DeltaFile, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "claims", tuple(sorted(self.claims, key=lambda f: f.path)))
        for what, count, bound in (
            ("requests", len(self.requests), MAX_REQUESTS),
            ("waves", len(self.waves), MAX_WAVES),
        ):
            if count > bound:
                raise InvalidRecord(f"{count} {what}, more than a record may hold ({bound})")
        for i, cls in enumerate(self.requests):
            if problem := cls.problem():
                raise InvalidRecord(f"requests[{i}]: {problem}")
        for i, wave in enumerate(self.waves):
            if problem := wave.problem(len(self.requests)):
                raise InvalidRecord(f"waves[{i}]: {problem}")
        for i, wave in enumerate(self.waves):
            if (
                made_up := sum(self.requests[j].prompt_tokens * n for j, n in wave.requests)
            ) > MAX_WAVE_PROMPT_TOKENS:
                raise InvalidRecord(
                    f"waves[{i}]: {made_up} made-up prompt tokens, more than {MAX_WAVE_PROMPT_TOKENS}"
                )
        sent = {index for wave in self.waves for index, _ in wave.requests}
        if unsent := sorted(set(range(len(self.requests))) - sent):
            raise InvalidRecord(f"requests[{unsent[0]}]: in no wave, so it would never be replayed")
        # The claims obey a delta's invariants (paths in their kind, bounded), so that
        # comparing them with a rebuild's files is comparing like with like.
        check(_Shape(key=self.key, base_image=None, base_manifest=self.base_manifest, files=self.claims))

    @classmethod
    def build(
        cls,
        *,
        key: CacheKey,
        base_manifest: str,
        replica: str,
        waves: Sequence[tuple[Sequence[tuple[RequestClass, int]], WaveSource, Sequence[str]]],
        claims: Sequence[DeltaFile],
    ) -> CaptureRecord:
        """A record from waves of (class, copies): each class kept once, waves pointing at it."""
        classes: list[RequestClass] = []
        built = []
        for members, source, compiled in waves:
            pairs = []
            for request, copies in members:
                if request not in classes:
                    classes.append(request)
                pairs.append((classes.index(request), copies))
            built.append(Wave(requests=tuple(pairs), source=source, compiled=tuple(compiled)))
        return cls(
            key=key,
            base_manifest=base_manifest,
            replica=replica,
            requests=tuple(classes),
            waves=tuple(built),
            claims=tuple(claims),
        )

    def sends(self) -> Iterator[list[tuple[dict[str, Any], Any]]]:
        """Per wave, each request's body (without ``prompt``) and prompt: the class's own, or
        made-up token IDs as many as the replica's prompt had."""
        salt = 0
        for wave in self.waves:
            bodies = []
            for index, copies in wave.requests:
                cls = self.requests[index]
                for _ in range(copies):
                    body = json.loads(cls.body)
                    prompt = (
                        made_up_prompt(cls.prompt_tokens, salt) if cls.prompt_tokens else body.pop("prompt")
                    )
                    bodies.append((body, prompt))
                    salt += 1
            yield bodies

    def sources(self) -> dict[str, int]:
        """How many waves came from each source."""
        return {s.value: sum(w.source is s for w in self.waves) for s in WaveSource}

    def to_json(self) -> str:
        doc = {
            "schema": SCHEMA,
            "key": str(self.key),
            "key_digest": self.key.digest,
            "base_manifest": self.base_manifest,
            "replica": self.replica,
            "requests": [r.to_json() for r in self.requests],
            "waves": [w.to_json() for w in self.waves],
            "claims": kinds_json(self.claims),
        }
        return jsondoc.dumps(doc)

    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = RECORD) -> CaptureRecord:
        return DOCUMENT.read(text, source=source, build=cls._of)

    @classmethod
    def _of(cls, doc: dict[str, Any]) -> CaptureRecord:
        requests, waves = _parse_requests(doc)
        return cls(
            key=parse_key(doc["key"]),
            base_manifest=str(doc["base_manifest"]),
            replica=str(doc.get("replica", "")),
            requests=requests,
            waves=waves,
            claims=tuple(files_of(doc["claims"])),
        )


def made_up_prompt(tokens: int, salt: int) -> list[int]:
    """``tokens`` token IDs, a sequence of their own for each ``salt``."""
    return [PROMPT_FIRST_ID + (salt * 7919 + i * 31) % _PROMPT_SPAN for i in range(tokens)]


def _parse_requests(doc: dict[str, Any]) -> tuple[tuple[RequestClass, ...], tuple[Wave, ...]]:
    """The classes and waves of a record document. Schema 1 (before serve noted classes) held
    bodies only, each replayed alone, as the operator gave them."""
    requests = doc["requests"]
    if not isinstance(requests, list) or len(requests) > MAX_REQUESTS:
        raise InvalidRecord(f"requests must be a list, at most {MAX_REQUESTS}: more than a record may hold")
    if doc["schema"] == 1:
        for i, body in enumerate(requests):
            if problem := request_problem(body):
                raise InvalidRecord(f"requests[{i}]: {problem}")
        return tuple(RequestClass.of(b) for b in requests), tuple(
            Wave(requests=((i, 1),), source=WaveSource.OPERATOR) for i in range(len(requests))
        )
    classes = []
    for i, entry in enumerate(requests):
        if not isinstance(entry, dict):
            raise InvalidRecord(f"requests[{i}]: an object with a body and its prompt_tokens")
        # Checked with the rest of the record (``CaptureRecord.__post_init__``).
        classes.append(RequestClass.of(entry.get("body"), entry.get("prompt_tokens", 0)))
    waves = doc["waves"]
    if not isinstance(waves, list) or len(waves) > MAX_WAVES:
        raise InvalidRecord(f"waves must be a list, at most {MAX_WAVES}: more than a record may hold")
    return tuple(classes), tuple(_wave(i, w) for i, w in enumerate(waves))


def _wave(i: int, entry: Any) -> Wave:
    if not isinstance(entry, dict) or not isinstance(entry.get("requests"), list):
        raise InvalidRecord(f"waves[{i}]: an object with a list of [class index, copies]")
    compiled = entry.get("compiled", [])
    if not isinstance(compiled, list) or not all(isinstance(c, str) for c in compiled):
        raise InvalidRecord(f"waves[{i}]: compiled must be a list of strings")
    pairs = entry["requests"]
    if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise InvalidRecord(f"waves[{i}]: each request is [class index, copies]")
    return Wave(
        requests=tuple((p[0], p[1]) for p in pairs[: MAX_WAVE_REQUESTS + 1]),
        source=WaveSource(entry.get("source")),
        compiled=tuple(compiled[: MAX_COMPILED + 1]),
    )
