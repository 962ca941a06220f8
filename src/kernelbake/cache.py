"""The one in-memory cache: bounded, thread-safe, least recently used out first.

Every cache of results in the host code is one of these (verdicts and tags in admission's
gateway, GPU verdicts in the judge, digest-addressed registry content, keyless trusted roots),
so memory stays flat however long a process runs. The one exception is admission's parse of an
image reference against the policy's patterns (``admit._classify``): a pure function of a few
strings, memoised by ``functools.lru_cache``, which is bounded too (and thread-safe). An entry may carry a time to live; content can also be
weighed (bytes) with a total bound besides the entry count.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """At most ``max_entries`` entries and, with ``weigh``, at most ``max_weight`` in total.
    ``None`` is what a miss returns, so it is never stored as a value."""

    def __init__(
        self,
        max_entries: int,
        *,
        max_weight: int | None = None,
        weigh: Callable[[V], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        if (max_weight is None) != (weigh is None):
            raise ValueError("max_weight and weigh go together")
        self._items: OrderedDict[K, tuple[float, int, V]] = OrderedDict()
        self._max_entries = max_entries
        self._max_weight = max_weight
        self._weigh = weigh
        self._weight = 0
        self._clock = clock
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The live value for ``key`` (now the most recently used), else None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            expires, weight, value = item
            if expires != math.inf and self._clock() >= expires:
                del self._items[key]
                self._weight -= weight
                return None
            self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V, ttl: float | None = None) -> None:
        """Keep ``value`` for ``ttl`` seconds (None: until evicted; 0 or less: not at all). A value
        heavier than ``max_weight`` is not kept."""
        if ttl is not None and ttl <= 0:
            return
        weight = self._weigh(value) if self._weigh is not None else 0
        if self._max_weight is not None and weight > self._max_weight:
            return
        expires = math.inf if ttl is None else self._clock() + ttl
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            self._items[key] = (expires, weight, value)
            self._weight += weight
            while len(self._items) > self._max_entries or (
                self._max_weight is not None and self._weight > self._max_weight
            ):
                _, (_, dropped, _) = self._items.popitem(last=False)
                self._weight -= dropped

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
