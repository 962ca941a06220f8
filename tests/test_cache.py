"""The one bounded cache: LRU order, entry and weight bounds, expiry."""

from __future__ import annotations

import threading

import pytest

from kernelbake.cache import BoundedCache
from tests.support.clock import Clock


def test_least_recently_used_goes_first() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)
    assert len(cache) == 2


def test_putting_again_replaces_and_refreshes() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b")) == (10, None)


def test_entries_expire_after_their_ttl() -> None:
    clock = Clock(100.0)
    cache: BoundedCache[str, str] = BoundedCache(10, clock=clock)
    cache.put("short", "x", 5)
    cache.put("forever", "y")
    clock.now += 4.9
    assert cache.get("short") == "x"
    clock.now += 0.1
    assert cache.get("short") is None
    assert len(cache) == 1
    clock.now += 1e9
    assert cache.get("forever") == "y"


def test_zero_ttl_is_not_stored() -> None:
    cache: BoundedCache[str, str] = BoundedCache(10, clock=Clock(100.0))
    cache.put("k", "v", 0)
    cache.put("n", "v", -1)
    assert len(cache) == 0 and cache.get("k") is None


def test_weight_bound_evicts_oldest_and_refuses_what_cannot_fit() -> None:
    cache: BoundedCache[str, bytes] = BoundedCache(100, max_weight=10, weigh=len)
    cache.put("a", b"1234")
    cache.put("b", b"1234")
    cache.put("c", b"1234")  # 12 > 10: a goes
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (None, b"1234", b"1234")
    cache.put("huge", b"x" * 11)
    assert cache.get("huge") is None and len(cache) == 2
    cache.put("b", b"1")  # replacing gives its weight back: 1 + 4 + 5 fits
    cache.put("d", b"12345")
    assert len(cache) == 3


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        BoundedCache(0)
    with pytest.raises(ValueError, match="together"):
        BoundedCache(1, max_weight=10)


def test_concurrent_use_keeps_the_bound() -> None:
    cache: BoundedCache[int, int] = BoundedCache(50)

    def work(base: int) -> None:
        for i in range(2000):
            cache.put(base + i, i)
            cache.get(base + i // 2)

    threads = [threading.Thread(target=work, args=(n * 10_000,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 50
