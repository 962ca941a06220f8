"""Warm or cold: whether this start uses the baked caches, as one value with every reason it
does not.

The preflight's steps each judge one thing (the key against this machine, the manifest, the
ranks, every file's bytes, a copy, a delta's leftovers) and each returns its reasons; the
decision is built from all of them at once, or from an earlier decision and the reasons one
later step adds (``ruled_out``), never by appending to a list that someone else's emptiness
test reads. A decision with a reason is cold, one without is warm: ``Decision`` checks that
when it is built, so no value says warm while holding a reason.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable


class Start(enum.Enum):
    """Whether this start uses the baked caches."""

    # The baked caches are used (some may still miss: the prediction says which).
    WARM = "warm"
    # A fresh, empty cache root: the engine compiles everything and reads no baked cache.
    COLD = "cold"


@dataclasses.dataclass(frozen=True)
class Decision:
    """Warm or cold, with every reason it is cold (a warm one with a reason cannot be built)."""

    start: Start
    # Why the baked caches are not used, in the order the preflight found them; empty when warm.
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.start is Start.COLD) != bool(self.reasons):
            raise ValueError(f"a {self.start.value} start with {len(self.reasons)} reasons to start cold")

    @classmethod
    def of(cls, found: Iterable[str]) -> Decision:
        """Warm where nothing was found against the baked caches, else cold for all of it."""
        found = tuple(found)
        return cls(Start.COLD if found else Start.WARM, found)

    @property
    def warm(self) -> bool:
        return self.start is Start.WARM

    def ruled_out(self, found: Iterable[str]) -> Decision:
        """This decision with what a later step found added (still warm if it found nothing)."""
        return Decision.of((*self.reasons, *found))
