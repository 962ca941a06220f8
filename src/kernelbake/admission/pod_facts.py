"""Cache deltas' facts shared by the workers of one pod (issue 41 item 4, across workers).

Each worker parsed a delta.json of its own: one signed 99,996-file delta under four names,
reviewed on both workers at once, was parsed by the first in 5.13 s while the second waited for
the pod's delta budget, then had to parse it again, and denied the pod past the 7.2 s
verification deadline (bench/admission_adversarial.py, ``multiplied_delta``). The facts are a
few hundred bytes (``signing.delta.DeltaFacts``) and a function of the layer's digest (the
registry client checks the bytes against it), so one worker's parse serves the pod: a table of
``SLOTS`` slots in memory the parent maps before it forks the workers, each a layer digest, what
state its read is in, and the facts once read (at most ``FACTS_BYTES`` of JSON; larger ones are
not shared, and each worker reads them itself).

Only a read that succeeded is written; a failed one frees its slot, and another worker reads
for itself. A read claimed longer ago than the caller's ``stale`` seconds is taken over (its
worker gave up on it). The signature is still verified under every name by the caller: this
holds what a digest's bytes say, not who vouches for them.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import json
import multiprocessing
import os
import time
from typing import Any

from kernelbake.contract.delta import Origin
from kernelbake.contract.key import parse_key
from kernelbake.signing.delta import DeltaFacts

SLOTS = 64
FACTS_BYTES = 4096


class Claim(enum.Enum):
    """What ``PodFacts.claim`` found for a digest."""

    DONE = "done"  # read by a worker of the pod: the facts come with it
    MINE = "mine"  # the caller reads it, and ``put``s or ``drop``s it after
    THEIRS = "theirs"  # another worker is reading it: ask again
    FULL = "full"  # every slot is being read: read without sharing


class _State(enum.IntEnum):
    EMPTY = 0
    READING = 1
    DONE = 2


class _Slot(ctypes.Structure):
    _fields_ = [
        ("state", ctypes.c_int),
        ("pid", ctypes.c_int),
        ("since", ctypes.c_double),  # CLOCK_MONOTONIC, one clock for every process of the host
        ("used", ctypes.c_double),
        ("key", ctypes.c_char * 64),  # sha256 of the layer's digest string, hex (no NUL: ctypes stops there)
        ("size", ctypes.c_int),
        ("data", ctypes.c_char * FACTS_BYTES),
    ]


def encode(facts: DeltaFacts) -> bytes:
    return json.dumps(
        {
            "manifest_digest": facts.manifest_digest,
            "key": str(facts.key),
            "base_image": facts.base_image,
            "base_manifest": facts.base_manifest,
            "files": facts.files,
            "bytes": facts.bytes,
            "origin": facts.origin.value,
            "replica": facts.replica,
            "builder": facts.builder,
        },
        separators=(",", ":"),
    ).encode()


def decode(data: bytes) -> DeltaFacts:
    doc: dict[str, Any] = json.loads(data)
    return DeltaFacts(
        manifest_digest=doc["manifest_digest"],
        key=parse_key(doc["key"]),
        base_image=doc["base_image"],
        base_manifest=doc["base_manifest"],
        files=doc["files"],
        bytes=doc["bytes"],
        origin=Origin(doc["origin"]),
        replica=doc["replica"],
        builder=doc["builder"],
    )


def _key(digest: str) -> bytes:
    return hashlib.sha256(digest.encode()).hexdigest().encode()


class PodFacts:
    """The table, made before the workers are forked (each then sees the same slots)."""

    def __init__(self, slots: int = SLOTS) -> None:
        context = multiprocessing.get_context("fork")
        self._slots = context.RawArray(_Slot, slots)
        self._lock = context.Lock()

    def claim(self, digest: str, *, stale: float) -> tuple[Claim, DeltaFacts | None]:
        """The facts of ``digest`` if a worker of the pod read them; else whether the caller
        reads them (``MINE``: it must ``put`` or ``drop`` after), waits for another worker
        (``THEIRS``), or reads without sharing (``FULL``)."""
        key, now = _key(digest), time.monotonic()
        with self._lock:
            slot = next((s for s in self._slots if s.state != _State.EMPTY and s.key == key), None)
            if slot is not None and slot.state == _State.DONE:
                data = bytes(slot.data[: slot.size])
                slot.used = now
            elif slot is not None and now - slot.since < stale:
                return Claim.THEIRS, None
            else:
                slot = slot or self._free(now, stale)
                if slot is None:
                    return Claim.FULL, None
                slot.state, slot.pid, slot.since, slot.used, slot.key = (
                    _State.READING,
                    os.getpid(),
                    now,
                    now,
                    key,
                )
                return Claim.MINE, None
        try:
            return Claim.DONE, decode(data)
        except (ValueError, KeyError, TypeError):
            # Written by this package in this pod: if it does not read back, the caller reads the
            # bytes itself rather than trust it.
            return Claim.FULL, None

    def _free(self, now: float, stale: float) -> _Slot | None:
        """An empty slot, else the one read longest ago, else one claimed ``stale`` seconds ago."""
        empty = next((s for s in self._slots if s.state == _State.EMPTY), None)
        if empty is not None:
            return empty
        done = [s for s in self._slots if s.state == _State.DONE]
        if done:
            return min(done, key=lambda s: s.used)
        return next((s for s in self._slots if now - s.since >= stale), None)

    def put(self, digest: str, facts: DeltaFacts) -> None:
        """The facts the caller read after ``MINE`` (not shared when larger than a slot)."""
        data = encode(facts)
        if len(data) > FACTS_BYTES:
            self.drop(digest)
            return
        key = _key(digest)
        with self._lock:
            slot = self._mine(key)
            if slot is not None:
                slot.data, slot.size, slot.state = data, len(data), _State.DONE

    def drop(self, digest: str) -> None:
        """Free the caller's slot for ``digest`` (its read failed): another worker reads it."""
        key = _key(digest)
        with self._lock:
            slot = self._mine(key)
            if slot is not None:
                slot.state = _State.EMPTY

    def _mine(self, key: bytes) -> _Slot | None:
        pid = os.getpid()
        return next(
            (s for s in self._slots if s.key == key and s.pid == pid and s.state != _State.EMPTY), None
        )

    def reading(self) -> int:
        """Slots being read now (for the tests)."""
        with self._lock:
            return sum(s.state == _State.READING for s in self._slots)
