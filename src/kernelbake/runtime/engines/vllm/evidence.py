"""What vLLM says about its caches, and what a start added to each cache directory.

Two independent kinds of evidence: vLLM's own log lines (it says when it loads a compiled
graph instead of compiling one), and the files a start writes into each cache kind — a
start that writes nothing into the Triton or FlashInfer directories compiled nothing there.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from kernelbake.contract.layout import CacheKind, kind_dir


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


def watcher(dirs: Mapping[str, Path]) -> Callable[[str], str | None]:
    """For ``kernelbake serve``: the first time vLLM says each thing, a line to report; and
    once it is ready, what start-up added to each cache directory in ``dirs``. vLLM logs
    nothing when it compiles a Triton kernel, so those files are the only evidence there."""
    seen: set[Signal] = set()
    before = snapshot(dirs)

    def watch(line: str) -> str | None:
        signal = scan_line(line)
        if signal is None or signal in seen:
            return None
        seen.add(signal)
        if signal is Signal.READY:
            return startup_report(added(before, snapshot(dirs)))
        report = _REPORTS.get(signal)
        return f"{report} ({line.strip()[:160]})" if report else None

    return watch


def startup_report(new: Mapping[str, set[str]]) -> str:
    counts = {name: len(files) for name, files in new.items()}
    if not any(counts.values()):
        return f"start-up compiled nothing: 0 new files in {', '.join(counts)}"
    shown = ", ".join(f"{name} {n}" for name, n in counts.items() if n)
    return (
        f"WARNING: start-up compiled what the caches lacked: new files in {shown}; "
        "the preflight notes above say why, if they know"
    )


def cache_dirs(root: Path, kinds: Iterable[CacheKind]) -> dict[str, Path]:
    """Each cache kind's directory under ``root``, by the kind's name."""
    return {kind.value: kind_dir(root, kind) for kind in kinds}


def snapshot(dirs: Mapping[str, Path]) -> dict[str, set[str]]:
    """Relative paths of the files under each named directory."""
    out: dict[str, set[str]] = {}
    for name, root in dirs.items():
        files: set[str] = set()
        if root.is_dir():
            for dirpath, _d, names in os.walk(root):
                for n in names:
                    files.add((Path(dirpath) / n).relative_to(root).as_posix())
        out[name] = files
    return out


def added(before: Mapping[str, set[str]], after: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """Files each start added per directory: none means everything it needed was there."""
    return {name: after.get(name, set()) - before.get(name, set()) for name in after}
