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

from kernelbake.runtime import redact

_SHOWN = 96


class Outcome(enum.Enum):
    HIT = "hit"
    MISS = "miss"
    # Some of this kind's entries still fit, the ones the changed inputs feed compile.
    PARTIAL = "partial"
    # Nothing of this kind was baked, so nothing can be missed.
    EMPTY = "empty"
    UNKNOWN = "unknown"


class Source(enum.Enum):
    ENGINE = "engine"
    FALLBACK = "fallback"
    # The engine was asked and failed to answer (``unavailable``): nothing is predicted.
    NONE = "none"


@dataclasses.dataclass(frozen=True)
class Change:
    factor: str
    baked: str
    now: str

    def __str__(self) -> str:
        return f"{self.factor}: {self.baked} → {self.now}"


@dataclasses.dataclass(frozen=True)
class KindVerdict:
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

    @property
    def hit(self) -> bool:
        return all(k.outcome in (Outcome.HIT, Outcome.EMPTY) for k in self.kinds)

    def kind(self, name: str) -> KindVerdict | None:
        return next((k for k in self.kinds if k.kind == name), None)

    @property
    def reasons(self) -> list[str]:
        out: list[str] = []
        for k in self.kinds:
            out += [f"{k.kind}: {c}" for c in k.changes if f"{k.kind}: {c}" not in out]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source.value,
            "predicted": "hit" if self.hit else "miss",
            "kinds": [k.to_json() for k in self.kinds],
            "reasons": self.reasons,
            **({"note": self.note} if self.note else {}),
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
        return cls(source=Source(doc["source"]), kinds=kinds, note=str(doc.get("note", "")))

    def lines(self) -> list[str]:
        if self.source is Source.NONE:
            return [f"no prediction: {self.note}"]
        how = "vLLM's own cache keys" if self.source is Source.ENGINE else "the image key only (FALLBACK)"
        out = [
            f"prediction from {how}: {'HIT' if self.hit else 'MISS'}"
            + (f" ({self.note})" if self.note else "")
        ]
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
        return [Change(path or "value", _short(baked, path), _short(now, path))]
    return []


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
    if baked.get("other") != now.get("other"):
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


def torch_compile_changes(baked: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change]:
    out: list[Change] = []
    if baked.get("version") != now.get("version"):
        out.append(Change("vllm version", str(baked.get("version")), str(now.get("version"))))
    out += _config_changes(baked.get("config", {}), now.get("config", {}))
    out += _hashed(baked.get("env", {}), now.get("env", {}), "env")
    out += _compiler_changes(baked, now)
    out += diff(baked.get("code_files", {}), now.get("code_files", {}), "traced file")
    if not out and baked.get("aot") != now.get("aot"):
        out += diff(baked.get("aot", {}), now.get("aot", {}), "aot_compile_hash_factors")
    return out


def _compiler_changes(baked: Mapping[str, Any], now: Mapping[str, Any]) -> list[Change]:
    return _hashed(baked.get("compiler", {}), now.get("compiler", {}), "compiler")


def predict(
    baked: Mapping[str, Any], now: Mapping[str, Any], baked_kinds: Iterable[str], *, note: str = ""
) -> Prediction:
    """Per kind, from the build's identity and the one the engine computes now.

    ``baked_kinds``: the kinds the bundle holds files of (others are ``EMPTY``)."""
    present = set(baked_kinds)
    tc = torch_compile_changes(baked, now)
    config_changed = bool(_config_changes(baked.get("config", {}), now.get("config", {})))
    verdicts: list[KindVerdict] = []

    def add(kind: str, changes: Sequence[Change], partial_note: str = "") -> None:
        if kind not in present:
            verdicts.append(KindVerdict(kind, Outcome.EMPTY))
        elif changes:
            verdicts.append(KindVerdict(kind, Outcome.MISS, tuple(changes)))
        elif partial_note:
            verdicts.append(KindVerdict(kind, Outcome.PARTIAL, (), partial_note))
        else:
            verdicts.append(KindVerdict(kind, Outcome.HIT))

    if now.get("graphs") == "inductor":
        # AOT compile off (vLLM's CPU build): the graphs torch.compile makes are Inductor's
        # FX-graph cache entries, so what changes them misses there; the vllm kind then holds
        # no graphs (only model info), which none of these factors keys.
        add("vllm", [])
        add("inductor", [*tc, *_compiler_changes(baked, now)])
    else:
        add("vllm", tc)
        add("inductor", _compiler_changes(baked, now))
    follows = (
        "the graphs recompile: kernels whose generated source changed compile, the rest load" if tc else ""
    )
    triton = diff(baked.get("triton", {}), now.get("triton", {}), "triton")
    add("triton", triton, follows)
    fi = diff(baked.get("flashinfer", {}), now.get("flashinfer", {}), "flashinfer")
    fi += [Change("flashinfer build.ninja path", p, "missing") for p in now.get("ninja_paths_missing", [])]
    add("flashinfer", fi, "the vLLM config changed: modules it needs anew compile" if config_changed else "")
    for kind in sorted(present - {v.kind for v in verdicts}):
        verdicts.append(KindVerdict(kind, Outcome.UNKNOWN, (), "kernelbake has no identity for this kind"))
    return Prediction(Source.ENGINE, tuple(verdicts), note, identity=now)


def unavailable(kinds: Iterable[str], reason: str) -> Prediction:
    """The engine failed while predicting: every baked kind ``UNKNOWN``, so not a hit (the
    reason says why, e.g. ``KeyError: 'vllm_c'`` from vLLM's own hash function)."""
    verdicts = tuple(KindVerdict(k, Outcome.UNKNOWN, (), "the engine did not answer") for k in kinds)
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
