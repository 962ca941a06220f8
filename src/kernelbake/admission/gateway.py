"""The only I/O of admission: verifying image references, cached per digest.

A verifier is any callable ``reference -> Subject`` (the real one is
``kernelbake.signing.verify.verify_image`` bound to the policy, see ``verifying``); tests inject
their own. The gateway runs verifiers on a bounded pool where each registry has its own share
(``lanes``: a slow or flooded registry fills its own lane and queue, never another's), lets
concurrent reviews of the same reference share one verification, drops queued verifications
that no review waits for any more, and keeps verdicts:

- accepted digests for ``cache.ttl_seconds`` (a digest's content cannot change);
- tag → digest resolutions for ``cache.tag_ttl_seconds`` (tags move);
- rejections for ``cache.rejected_ttl_seconds``;
- registry failures never.

The cache is an LRU bounded by ``cache.max_entries``, so memory stays flat however many
reviews arrive.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol, TypeAlias

from kernelbake.admission.lanes import Lanes, Saturated
from kernelbake.admission.policy import CachePolicy
from kernelbake.admission.references import ImageRef
from kernelbake.admission.subject import (
    Accepted,
    IndexAccepted,
    Outcome,
    Rejected,
    Subject,
    Unavailable,
    VerifiedIndex,
)
from kernelbake.cache import BoundedCache
from kernelbake.errors import KernelbakeError
from kernelbake.oci.errors import RegistryUnavailable

log = logging.getLogger(__name__)


class Verifier(Protocol):
    """Verify one reference (tag or digest): return what it verified as (``subject.Subject``, or
    a GPU index) or raise ``ImageRejected`` / ``RegistryUnavailable``."""

    def __call__(self, reference: str, /) -> Subject | VerifiedIndex: ...


# Resolve a tag reference to its current digest without verifying (a manifest HEAD).
Resolver: TypeAlias = Callable[[str], str]


class ImageRejected(KernelbakeError):
    """The image is not acceptable: unsigned, wrong signer, labels disagree with the attestation …"""

    return_code = 7


class Gateway:
    def __init__(
        self,
        verify: Verifier,
        *,
        cache: CachePolicy,
        workers: int,
        registry_workers: int | None = None,
        registry_queue: int = 64,
        resolve: Resolver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``workers`` verifications at once in all, at most ``registry_workers`` (default: all)
        of them for one registry, and at most ``registry_queue`` waiting per registry."""
        self._verify = verify
        self._resolve = resolve
        self._policy = cache
        self._verdicts: BoundedCache[str, Outcome] = BoundedCache(cache.max_entries, clock=clock)
        self._tags: BoundedCache[str, str] = BoundedCache(cache.max_entries, clock=clock)
        self._lanes: Lanes[Outcome] = Lanes(
            workers, registry_workers or workers, registry_queue, thread_name_prefix="kb-verify"
        )
        self._inflight: dict[str, concurrent.futures.Future[Outcome]] = {}
        # Reviews waiting for each verification in flight; at 0 a queued one is dropped.
        self._waiters: collections.Counter[concurrent.futures.Future[Outcome]] = collections.Counter()
        # Re-entrant: cancelling a queued job runs its done-callback (``_forget``) at once.
        self._lock = threading.RLock()

    @property
    def cached_entries(self) -> int:
        return len(self._verdicts) + len(self._tags)

    def cached(self, ref: ImageRef) -> Outcome | None:
        """The verdict for ``ref`` if the cache has it, without any I/O."""
        if ref.digest is not None:
            return self._verdict(ref.by_digest())
        digest = self._tags.get(str(ref))
        if isinstance(digest, str):
            return self._verdict(f"{ref.name}@{digest}")
        return self._verdict(str(ref))

    def submit(self, ref: ImageRef) -> concurrent.futures.Future[Outcome]:
        """A future for the verdict on ``ref``; already done when cached. If both a tag and a
        digest are given, the digest is what is verified. The caller counts as waiting for it
        until it calls ``done_waiting``; one that never does lets the verification run."""
        hit = self.cached(ref)
        if hit is not None:
            return _done(hit)
        target = ref.by_digest() if ref.digest is not None else str(ref)
        with self._lock:
            running = self._inflight.get(target)
            if running is not None:
                self._waiters[running] += 1
                return running
            try:
                future = self._lanes.submit(ref.domain, lambda: self._run(ref, target))
            except Saturated as exc:
                return _done(
                    Unavailable(
                        f"could not ask: registry {ref.domain} is saturated "
                        f"({exc.queued} verifications queued)"
                    )
                )
            except RuntimeError:
                # The lanes are shut down: the server is stopping.
                return _done(Unavailable("the webhook is shutting down"))
            self._inflight[target] = future
            self._waiters[future] = 1
            future.add_done_callback(lambda _: self._forget(target, future))
        return future

    def done_waiting(self, futures: Iterable[concurrent.futures.Future[Outcome]]) -> None:
        """A review no longer waits for ``futures`` (answered, or out of time). A verification
        nobody waits for any more is dropped if it has not started; one that has started runs
        on and fills the cache."""
        with self._lock:
            for future in futures:
                if future not in self._waiters:
                    continue
                self._waiters[future] -= 1
                if self._waiters[future] <= 0:
                    del self._waiters[future]
                    self._lanes.cancel(future)

    def queued(self, registry: str) -> int:
        """Verifications waiting for a thread in ``registry``'s lane."""
        return self._lanes.queued(registry)

    def running(self, registry: str) -> int:
        return self._lanes.running(registry)

    def close(self) -> None:
        self._lanes.shutdown()

    def _forget(self, target: str, future: concurrent.futures.Future[Outcome]) -> None:
        with self._lock:
            if self._inflight.get(target) is future:
                del self._inflight[target]
            self._waiters.pop(future, None)

    def _verdict(self, key: str) -> Outcome | None:
        value = self._verdicts.get(key)
        return value if isinstance(value, Accepted | IndexAccepted | Rejected) else None

    def _run(self, ref: ImageRef, target: str) -> Outcome:
        try:
            if ref.digest is None and self._resolve is not None:
                digest = self._resolve(target)
                self._tags.put(target, digest, self._policy.tag_ttl_seconds)
                hit = self._verdict(f"{ref.name}@{digest}")
                if hit is not None:
                    return hit
                target = f"{ref.name}@{digest}"
            image = self._verify(target)
        except RegistryUnavailable as exc:
            return Unavailable(str(exc))
        except KernelbakeError as exc:
            outcome: Outcome = Rejected(str(exc))
            self._verdicts.put(target, outcome, self._policy.rejected_ttl_seconds)
            return outcome
        except Exception as exc:
            # A bug must not admit anything, nor take the server down.
            log.exception("verifying %s failed unexpectedly", target)
            return Rejected(f"verification failed unexpectedly ({type(exc).__name__}: {exc})")
        accepted = IndexAccepted(image) if isinstance(image, VerifiedIndex) else Accepted(image)
        self._verdicts.put(f"{ref.name}@{image.digest}", accepted, self._policy.ttl_seconds)
        if ref.digest is None:
            self._tags.put(str(ref), image.digest, self._policy.tag_ttl_seconds)
        return accepted


def _done(outcome: Outcome) -> concurrent.futures.Future[Outcome]:
    future: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
    future.set_result(outcome)
    return future
