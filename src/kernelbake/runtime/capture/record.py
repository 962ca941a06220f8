"""``kernelbake capture record``: what a replica compiled that its build had not, as a record
for a trusted rebuild (``contract.record``), never as bytes.

Runs where ``capture collect`` runs (in the replica, or a sidecar that shares its cache volume
and its scratch folder). Two sources, both the replica's word:

- the batches ``serve`` noted as the engine compiled during them (``engines.vllm.misses``
  writes them to ``RuntimeEnv.miss_notes``), each a wave of request classes with what
  compiled; a file anything in the replica could write, so read bounded, line by line, and
  each wave checked as a record checks it;
- the files the cache root gained since the image's bundle (``capture.collect.scan``, the diff
  ``collect`` copies), hashed where they lie as claims.

The operator may add classes (``--request``), each a batch of its own.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.contract.delta import DeltaFile
from kernelbake.contract.record import (
    MAX_COMPILED,
    MAX_COMPILED_CHARS,
    MAX_REQUESTS,
    MAX_WAVE_REQUESTS,
    MAX_WAVES,
    CaptureRecord,
    RequestClass,
    WaveSource,
)
from kernelbake.errors import BadInput
from kernelbake.runtime.bundle import file_sha256
from kernelbake.runtime.capture.collect import SHOWN, scan
from kernelbake.runtime.env import RuntimeEnv

# A noted wave: its classes with their copies, and what compiled during it.
Noted = tuple[list[tuple[RequestClass, int]], list[str]]
Planned = tuple[list[tuple[RequestClass, int]], WaveSource, list[str]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recorded:
    out: Path
    record: CaptureRecord
    refused: tuple[str, ...]
    notes: Path  # where serve's notes were read
    skipped: tuple[str, ...]  # notes and requests left out, and why

    def lines(self) -> list[str]:
        kinds = ", ".join(
            f"{k} {len(v['files'])} files, {len(v['engine_keys'])} engine keys"
            for k, v in sorted(json.loads(self.record.to_json())["claims"].items())
        )
        sources = self.record.sources()
        head = [
            f"recorded {len(self.record.requests)} request classes in {len(self.record.waves)} batches "
            f"({sources['served']} noted by serve as they compiled, {sources['operator']} given with --request) "
            f"and {len(self.record.claims)} new files ({kinds or 'none'}) into {self.out} "
            f"({self.record.digest()}); no bytes are kept: 'kernelbake capture rebuild' compiles them again "
            "from the signed image"
        ]
        if not self.record.waves:
            head.append(
                f"no request classes: serve noted no batch that compiled ({self.notes}) and none was given "
                "with --request; the rebuild replays none, so it reproduces only what the image's own start "
                "compiles"
            )
        elif self.record.claims and not sources["served"]:
            head.append(
                f"the caches gained {len(self.record.claims)} files but serve noted no batch that compiled "
                f"({self.notes}): a compiler kernelbake does not hook (DeepGEMM, TensorRT-LLM) or a start "
                "that predates the notes; only the classes given with --request are replayed"
            )
        shown = [f"left out {s}" for s in self.skipped[:SHOWN]]
        return head + shown + [f"refused {r}" for r in self.refused[:SHOWN]]


# serve's notes are the replica's file, read like any input from it: bounded.
MAX_NOTES_BYTES = 4 << 20


def _noted_wave(line: bytes) -> Noted:
    """One wave of serve's notes; ``ValueError`` saying what is wrong with it."""
    doc = jsondoc.loads(line)
    members, compiled = doc["wave"], doc.get("compiled", [])
    if not isinstance(members, list) or not members or not isinstance(compiled, list):
        raise ValueError("not a wave")
    wave = []
    for m in members:
        cls = RequestClass.of(m["body"], m["prompt_tokens"])
        if (problem := cls.problem()) is not None or cls.prompt_tokens < 1:
            raise ValueError(problem or "no prompt_tokens")
        copies = m["copies"]
        if not isinstance(copies, int) or isinstance(copies, bool) or not 0 < copies <= MAX_WAVE_REQUESTS:
            raise ValueError(f"copies {copies!r}")
        wave.append((cls, copies))
    if sum(c for _, c in wave) > MAX_WAVE_REQUESTS:
        raise ValueError(f"more than {MAX_WAVE_REQUESTS} requests")
    return wave, [str(c)[:MAX_COMPILED_CHARS] for c in compiled[:MAX_COMPILED]]


def read_notes(path: Path) -> tuple[list[Noted], list[str]]:
    """The waves ``serve`` noted at ``path`` (none when it holds none), each once; and the lines
    it could not use, named."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_NOTES_BYTES + 1)
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"{path}: cannot be read ({exc.strerror or exc})"]
    skipped = [f"{path}: past its first {MAX_NOTES_BYTES} B"] if len(data) > MAX_NOTES_BYTES else []
    waves: list[Noted] = []
    seen: set[str] = set()
    for number, line in enumerate(data[:MAX_NOTES_BYTES].splitlines(), 1):
        try:
            wave, compiled = _noted_wave(line)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            skipped.append(f"{path}:{number}: not a noted wave ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        key = json.dumps([(c.body, c.prompt_tokens, n) for c, n in wave])
        if key not in seen:
            seen.add(key)
            waves.append((wave, compiled))
    return waves, skipped


def _bounded(waves: list[Planned], skipped: list[str]) -> list[Planned]:
    """``waves`` up to a record's bounds, in order; what is left out is named."""
    kept: list[Planned] = []
    classes: set[RequestClass] = set()
    for wave in waves:
        more = classes | {c for c, _ in wave[0]}
        if len(kept) >= MAX_WAVES or len(more) > MAX_REQUESTS:
            skipped.append(f"a {wave[1].value} batch of {len(wave[0])} classes: past the record's bounds")
            continue
        kept.append(wave)
        classes = more
    return kept


def record(
    env: RuntimeEnv,
    out: Path,
    requests: list[dict[str, Any]],
    *,
    root: Path | None = None,
    replica: str = "",
    notes: Path | None = None,
) -> Recorded:
    """What this replica compiled that the build had not, as a record for a trusted rebuild:
    the batches serve noted as they compiled (``notes``, by default where serve writes them),
    the operator's ``requests``, each a batch of its own, and the new files as claims (hashed
    where they lie, copied nowhere), written to the file ``out``, which must not exist yet."""
    if out.exists() or out.is_symlink():
        raise BadInput(f"{out}: exists; capture record writes a new file only")
    found = scan(env, root)
    claims = []
    for rel, kind in found.found:
        try:
            size = (found.root / rel).lstat().st_size
            sha = file_sha256(found.root / rel)
        except OSError as exc:
            raise BadInput(
                f"{found.root / rel}: cannot be read ({exc.strerror or exc}); nothing was written"
            ) from None
        claims.append(DeltaFile(path=rel, size=size, sha256=sha, kind=kind))
    notes = notes or env.miss_notes
    noted, skipped = read_notes(notes)
    waves = [(wave, WaveSource.SERVED, compiled) for wave, compiled in noted]
    waves += [([(RequestClass.of(body), 1)], WaveSource.OPERATOR, []) for body in requests]
    doc = CaptureRecord.build(
        key=found.target.key,
        base_manifest=found.base,
        replica=replica,
        waves=_bounded(waves, skipped),
        claims=claims,
    )
    out.write_text(doc.to_json())
    return Recorded(out=out, record=doc, refused=tuple(found.refused), notes=notes, skipped=tuple(skipped))
