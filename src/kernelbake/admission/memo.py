"""Answers that depend on a verified thing and the pod's placement, memoised: the GPU verdict on
an image's key (``gpus.Judge``) and the variant of a GPU index it picks (``variants.Picker``).

A cluster runs few distinct (image, placement) pairs, so a warm review skips the comparisons
entirely. The shared memo is keyed by the thing's identity: it comes from the gateway's cached
verdict, so the same object recurs, and hashing a 23-field key (or every key of an index) on
each review is what this saves. A review's own memo, in front, is keyed by the identity of the
ways too: the shared one hashes and compares the ways on every call (linear in their values),
which a review naming many images would pay once per image.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Generic, Self, TypeVar

from kernelbake.admission.policy import GpuMatch
from kernelbake.admission.scheduling import MEMO_WEIGHT, Way, weight
from kernelbake.cache import BoundedCache
from kernelbake.catalogue import Catalogue

T = TypeVar("T")
R = TypeVar("R")


class PlacementMemo(Generic[T, R]):
    """``compute(thing, ways)``, bounded and thread-safe; placements heavier than
    ``MEMO_WEIGHT`` are answered afresh, not kept."""

    def __init__(self, compute: Callable[[T, Sequence[Way]], R], max_entries: int) -> None:
        self._compute = compute
        self._memo: BoundedCache[tuple[int, tuple[Way, ...]], tuple[T, R]] = BoundedCache(max_entries)

    def __len__(self) -> int:
        return len(self._memo)

    def __call__(self, thing: T, ways: Sequence[Way]) -> R:
        if weight(ways) > MEMO_WEIGHT:
            return self._compute(thing, ways)
        key = (id(thing), tuple(ways))
        hit = self._memo.get(key)
        if hit is not None and hit[0] is thing:
            return hit[1]
        found = self._compute(thing, ways)
        # Holding the thing keeps its id from being reused while the entry lives.
        self._memo.put(key, (thing, found))
        return found


class ReviewMemo(Generic[T, R]):
    """``shared`` with one review's memo in front (made per review, dropped with it)."""

    def __init__(self, shared: Callable[[T, Sequence[Way]], R]) -> None:
        self._shared = shared
        self._seen: dict[tuple[int, int], tuple[T, Sequence[Way], R]] = {}

    def __call__(self, thing: T, ways: Sequence[Way]) -> R:
        hit = self._seen.get((id(thing), id(ways)))
        if hit is not None and hit[0] is thing and hit[1] is ways:
            return hit[2]
        found = self._shared(thing, ways)
        self._seen[(id(thing), id(ways))] = (thing, ways, found)
        return found


class Answers(abc.ABC, Generic[T, R]):
    """An answer for one catalogue and match mode that depends only on the thing and the pod's
    ways (``_answer``, which each kind defines), memoised: a ``PlacementMemo`` shared by every
    review, and, through ``for_review``, one review's ``ReviewMemo`` in front of it."""

    def __init__(self, catalogue: Catalogue, match: GpuMatch, *, max_entries: int = 4096) -> None:
        self.catalogue, self.match = catalogue, match
        self._memo: PlacementMemo[T, R] | ReviewMemo[T, R] = PlacementMemo(self._answer, max_entries)

    @abc.abstractmethod
    def _answer(self, thing: T, ways: Sequence[Way]) -> R: ...

    def __call__(self, thing: T, ways: Sequence[Way]) -> R:
        return self._memo(thing, ways)

    def for_review(self) -> Self:
        """This one with a memo for one review in front of the shared one (itself, when it has
        one already): the review's calls reach the shared one through its own ``__call__``."""
        if isinstance(self._memo, ReviewMemo):
            return self
        # A shallow copy made by hand: copy.copy costs five times as much (2.7 against 0.6 us),
        # and every review makes two.
        review = object.__new__(type(self))
        review.__dict__.update(self.__dict__)
        review._memo = ReviewMemo(self)
        return review
