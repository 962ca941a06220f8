"""What vLLM says about its caches, and what a start added to each cache directory.

Two independent kinds of evidence: vLLM's own log lines (it says when it loads a compiled
graph instead of compiling one), and the files a start writes into each cache kind — a
start that writes nothing into the Triton or FlashInfer directories compiled nothing there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from kernelbake.contract import jsondoc
from kernelbake.contract.layout import MANIFEST, CacheKind, kind_dir
from kernelbake.runtime.bundle import file_sha256
from kernelbake.runtime.prediction import NOTHING_COMPILES, Outcome, Prediction

# The line vLLM's API server prints with its prediction (engines.vllm.predict.MARK).
PREDICTION_MARK = "kernelbake-prediction-json: "


class Signal(enum.Enum):
    AOT_LOADED = "aot_loaded"
    GRAPH_LOADED = "graph_loaded"
    COMPILED = "compiled"
    AOT_SAVED = "aot_saved"
    LOAD_FAILED = "load_failed"
    FLASHINFER_BUILD = "flashinfer_build"
    READY = "ready"


# vLLM 0.26 log lines (compilation/decorators.py, compilation/backends.py) and FlashInfer's
# JIT logger. Matched loosely so a reworded prefix or a changed path still counts.
_PATTERNS: tuple[tuple[Signal, re.Pattern[str]], ...] = (
    (Signal.AOT_LOADED, re.compile(r"Directly load AOT compilation from path")),
    (Signal.GRAPH_LOADED, re.compile(r"Directly load the compiled graph\(s\)")),
    # Not "torch.compile took …": vLLM logs that after a cache load too.
    (Signal.COMPILED, re.compile(r"Compiling a graph for ")),
    (Signal.AOT_SAVED, re.compile(r"saved AOT compiled function to")),
    (Signal.LOAD_FAILED, re.compile(r"Compiling model again due to a load failure")),
    (
        Signal.FLASHINFER_BUILD,
        re.compile(r"flashinfer\.jit: (Building|Compiling)|ninja: .*build", re.IGNORECASE),
    ),
    # Uvicorn's, once vLLM's API server is up: start-up (and its warm-up) is over.
    (Signal.READY, re.compile(r"Application startup complete")),
)


def scan_line(line: str) -> Signal | None:
    for signal, pattern in _PATTERNS:
        if pattern.search(line):
            return signal
    return None


@dataclasses.dataclass
class LogEvidence:
    counts: dict[Signal, int] = dataclasses.field(default_factory=dict)
    examples: dict[Signal, str] = dataclasses.field(default_factory=dict)

    def feed(self, line: str) -> Signal | None:
        signal = scan_line(line)
        if signal is not None:
            self.counts[signal] = self.counts.get(signal, 0) + 1
            self.examples.setdefault(signal, line.strip()[:300])
        return signal

    def feed_all(self, lines: Iterable[str]) -> LogEvidence:
        for line in lines:
            self.feed(line)
        return self

    @property
    def torch_compile_hit(self) -> bool | None:
        """True when vLLM loaded its compiled model and compiled nothing; None when it said neither."""
        loaded = self.counts.get(Signal.AOT_LOADED, 0) + self.counts.get(Signal.GRAPH_LOADED, 0)
        compiled = self.counts.get(Signal.COMPILED, 0) + self.counts.get(Signal.LOAD_FAILED, 0)
        if not loaded and not compiled:
            return None
        return loaded > 0 and compiled == 0

    def to_json(self) -> dict[str, object]:
        return {
            "torch_compile_hit": self.torch_compile_hit,
            "counts": {s.value: n for s, n in sorted(self.counts.items(), key=lambda kv: kv[0].value)},
            "examples": {s.value: e for s, e in sorted(self.examples.items(), key=lambda kv: kv[0].value)},
        }


_REPORTS = {
    Signal.AOT_LOADED: "cache HIT: vLLM loaded the baked torch.compile artifact",
    Signal.GRAPH_LOADED: "cache HIT: vLLM loaded the baked compiled graphs",
    Signal.COMPILED: "WARNING: cache MISS: vLLM is compiling graphs; see the preflight notes above for why",
    Signal.LOAD_FAILED: "WARNING: vLLM could not load the baked artifact and recompiles",
    Signal.FLASHINFER_BUILD: "WARNING: FlashInfer is JIT-compiling a module that was not baked",
}


class Watcher:
    """For ``kernelbake serve``: the first time vLLM says each thing, a line to report; the
    prediction vLLM's API server logged (``predict.MARK``); and once it is ready, what start-up
    added to each cache directory, checked against that prediction. vLLM logs nothing when it
    compiles a Triton kernel, so those files are the only evidence there."""

    def __init__(
        self, dirs: Mapping[str, Path], baked: Mapping[str, Mapping[str, str]] | None = None
    ) -> None:
        self.dirs = dict(dirs)
        self.baked = baked or {}
        self.before = snapshot(self.dirs)
        self.log = LogEvidence()
        self.prediction: Prediction | None = None
        self.new: dict[str, set[str]] | None = None
        self.rebenchmarked: dict[str, set[str]] = {}
        self.wrong: list[str] = []
        self._seen: set[Signal] = set()

    def __call__(self, line: str) -> str | None:
        if (at := line.find(PREDICTION_MARK)) >= 0:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self.prediction = Prediction.from_json(jsondoc.loads(line[at + len(PREDICTION_MARK) :]))
            return None
        signal = self.log.feed(line)
        if signal is None or signal in self._seen:
            return None
        self._seen.add(signal)
        if signal is Signal.READY:
            self.new, self.rebenchmarked = changes(self.before, snapshot(self.dirs), self.dirs, self.baked)
            self.wrong = compare(self.prediction, self.log, self.new)
            return "\n".join([startup_report(self.new, self.rebenchmarked), *self.wrong])
        report = _REPORTS.get(signal)
        return f"{report} ({line.strip()[:160]})" if report else None

    @staticmethod
    def quiet(line: str) -> bool:
        """The prediction's JSON line: read here and kept in the status file, not shown."""
        return PREDICTION_MARK in line

    def status(self) -> dict[str, object]:
        return {
            "prediction": self.prediction.to_json() if self.prediction else None,
            "evidence": {
                "log": self.log.to_json(),
                "files_added": {k: len(v) for k, v in (self.new or {}).items()},
                "autotune_rebenchmarked": {k: len(v) for k, v in self.rebenchmarked.items() if v},
                "actual": actual(self.log, self.new) if self.new is not None else None,
            },
            "prediction_wrong": self.wrong,
            "ready": self.new is not None,
        }


def watcher(dirs: Mapping[str, Path], baked: Mapping[str, Mapping[str, str]] | None = None) -> Watcher:
    return Watcher(dirs, baked)


def actual(log: LogEvidence, new: Mapping[str, set[str]]) -> dict[str, str]:
    """What each kind did: ``hit`` when start-up wrote nothing there, neither a new file nor
    a rewritten one (and, for torch.compile, vLLM said it loaded rather than compiled, when it
    said either)."""
    out = {kind: ("miss" if files else "hit") for kind, files in new.items()}
    if "vllm" in out and log.torch_compile_hit is False:
        out["vllm"] = "miss"
    return out


def compare(prediction: Prediction | None, log: LogEvidence, new: Mapping[str, set[str]]) -> list[str]:
    """Where the prediction and what vLLM did disagree, one loud line each: a kind predicted
    to compile nothing (hit, re-trace only, no compile) that got files, one predicted to
    compile (miss, bypassed) that got none, one predicted to get a knob's files (writes)
    that got none, or a start predicted to fail that came up."""
    if prediction is None:
        return []
    did = actual(log, new)
    wrong = []
    if prediction.predicted == Outcome.FAILS.value:
        # Called once vLLM is ready: the start it was to refuse came up.
        why = "; ".join(str(c) for k in prediction.kinds for c in k.changes[:1])
        return [f"WARNING: prediction wrong: predicted the engine refuses these settings ({why}), it started"]
    for verdict in prediction.kinds:
        seen = did.get(verdict.kind)
        if seen is None or verdict.outcome in (Outcome.PARTIAL, Outcome.UNKNOWN):
            continue
        if verdict.outcome is Outcome.WRITES:
            # A debug knob's files are the prediction; none at all is what contradicts it.
            if seen == "hit":
                why = "; ".join(str(c) for c in verdict.changes[:3]) or verdict.note
                wrong.append(
                    f"WARNING: prediction wrong: predicted writes ({why}), vLLM wrote nothing in {verdict.kind}"
                )
            continue
        expected_hit = verdict.outcome in NOTHING_COMPILES
        if expected_hit and seen == "miss":
            what = f"{len(new.get(verdict.kind, ()))} new files in {verdict.kind}"
            if verdict.kind == "vllm" and (
                example := log.examples.get(Signal.COMPILED) or log.examples.get(Signal.LOAD_FAILED)
            ):
                what += f"; vLLM said {example[:120]!r}"
            wrong.append(
                f"WARNING: prediction wrong: predicted {verdict.outcome.value} for {verdict.kind}, "
                f"vLLM compiled ({what})"
            )
        elif not expected_hit and seen == "hit":
            why = "; ".join(str(c) for c in verdict.changes[:3]) or verdict.note
            wrong.append(
                f"WARNING: prediction wrong: predicted miss ({why}), vLLM compiled nothing for {verdict.kind}"
            )
    return wrong


def startup_report(new: Mapping[str, set[str]], rebenchmarked: Mapping[str, set[str]] | None = None) -> str:
    counts = {name: len(files) for name, files in new.items()}
    if not any(counts.values()):
        text = f"start-up compiled nothing: 0 new files in {', '.join(counts)}"
    else:
        shown = ", ".join(f"{name} {n}" for name, n in counts.items() if n)
        text = (
            f"WARNING: start-up compiled what the caches lacked: new files in {shown}; "
            "the preflight notes above say why, if they know"
        )
    if n := sum(len(v) for v in (rebenchmarked or {}).values()):
        text += (
            # Worded so that no compile-line filter (bench/vllm_image_flow.COMPILE_LINE) takes
            # it for one: nothing is built here.
            f"\nInductor benchmarked the launch configs of {n} baked kernels again (it rewrote their "
            "baked .best_config; docs/vllm.md, 'Launch configs benchmarked again at start'); nothing was built"
        )
    return text


# Inductor writes a kernel's ``.best_config`` only after benchmarking more than one launcher
# (torch/_inductor/runtime/triton_heuristics.py, ``save_cache_hook`` in autotune_to_one_config
# and its coordinate-descent and combo passes). A baked one rewritten with other bytes is a
# benchmark run again, not a compile; why torch 2.13 runs it is read in docs/vllm.md
# ("Launch configs benchmarked again at start", to be confirmed by bench/autotune_probe.py on the
# GPU). Seen on the H200 at every baked start of 0.26's FP8 MoE (4 files) and at 0.32's
# Qwen3-8B baked start (2), with no new Triton file (what it benchmarks loads from the bundle).
AUTOTUNE_RESULT = ".best_config"


def split_rebenchmarked(
    found: Mapping[str, set[str]], before: Mapping[str, Mapping[str, object]]
) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``added``'s files as (what compiled, baked Inductor autotune results rewritten)."""
    compiled: dict[str, set[str]] = {}
    rebenchmarked: dict[str, set[str]] = {}
    for name, paths in found.items():
        old = before.get(name, {})
        rebenchmarked[name] = {p for p in paths if p.endswith(AUTOTUNE_RESULT) and p in old}
        compiled[name] = set(paths) - rebenchmarked[name]
    return compiled, rebenchmarked


def cache_dirs(root: Path, kinds: Iterable[CacheKind]) -> dict[str, Path]:
    """Each cache kind's directory under ``root``, by the kind's name."""
    return {kind.value: kind_dir(root, kind) for kind in kinds}


def snapshot(dirs: Mapping[str, Path]) -> dict[str, dict[str, tuple[int, int]]]:
    """Per named directory: each file's relative path with its size and modification time."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for name, root in dirs.items():
        files: dict[str, tuple[int, int]] = {}
        if root.is_dir():
            for dirpath, _d, names in os.walk(root):
                for n in names:
                    path = Path(dirpath) / n
                    with contextlib.suppress(OSError):
                        st = path.stat()
                        files[path.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
        out[name] = files
    return out


def baked_digests(
    root: Path, dirs: Mapping[str, Path], files: Iterable[tuple[str, str]]
) -> dict[str, dict[str, str]]:
    """The manifest's ``(path, sha256)`` pairs (paths relative to ``root``) by watched
    directory, each path relative to its directory: what ``added`` compares a rewritten file
    with."""
    out: dict[str, dict[str, str]] = {name: {} for name in dirs}
    for path, sha256 in files:
        full = root / path
        for name, d in dirs.items():
            if full.is_relative_to(d):
                out[name][full.relative_to(d).as_posix()] = sha256
                break
    return out


# In ``baked_digests``' maps: the manifest lists this path as a log the engine appends to
# (``Manifest.logs``), not a cache file. Never a sha256, so no file's bytes can match it.
APPENDED_LOG = "appended-log"


def manifest_digests(root: Path, dirs: Mapping[str, Path]) -> dict[str, dict[str, str]]:
    """``baked_digests`` of the manifest at ``root``, with its appended logs as
    ``APPENDED_LOG``: none when there is no readable manifest (a cold start; where there is
    one, the preflight has checked it against the pin)."""
    try:
        doc = jsondoc.loads((root / MANIFEST).read_text())
        files = [(str(f["path"]), str(f["sha256"])) for f in doc.get("files", [])]
        files += [(str(path), APPENDED_LOG) for path in doc.get("logs", [])]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        files = []
    return baked_digests(root, dirs, files)


def _sha256(path: Path) -> str | None:
    try:
        return file_sha256(path)
    except OSError:
        return None


def added(
    before: Mapping[str, Mapping[str, tuple[int, int]]],
    after: Mapping[str, Mapping[str, tuple[int, int]]],
    dirs: Mapping[str, Path] | None = None,
    baked: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, set[str]]:
    """Files each start added or rewrote per directory: none means everything it needed was
    there. A rewritten file counts when its bytes changed: Inductor regenerates a baked module
    in place when the graph that keys it compiled again. vLLM and FlashInfer rewrite some
    baked files at every start with the same bytes (a new mtime only), which compiles
    nothing: a rewritten file whose sha256 is still the one ``baked`` (the manifest's, by
    ``baked_digests``) records is left out. So is a log the manifest names (``APPENDED_LOG``):
    FlashInfer appends to its ``flashinfer_jit.log`` at every start, and nothing loads it.
    Without ``baked`` every rewrite counts."""
    out: dict[str, set[str]] = {}
    for name, files in after.items():
        old = before.get(name, {})
        known = (baked or {}).get(name, {})
        changed = {
            path for path, stat in files.items() if old.get(path) != stat and known.get(path) != APPENDED_LOG
        }
        if dirs is not None and name in dirs:
            changed = {
                path
                for path in changed
                if not (path in old and path in known and _sha256(dirs[name] / path) == known[path])
            }
        out[name] = changed
    return out


def changes(
    before: Mapping[str, Mapping[str, tuple[int, int]]],
    after: Mapping[str, Mapping[str, tuple[int, int]]],
    dirs: Mapping[str, Path] | None,
    baked: Mapping[str, Mapping[str, str]] | None,
) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """What a start did to each directory, as ``serve``'s watcher, the key matrix and the
    image flow judge it: (files it added or rewrote with other bytes, less the baked autotune
    results it benchmarked again; those results)."""
    return split_rebenchmarked(added(before, after, dirs, baked), before)
