"""One review from document to answer, shared by the HTTPS server (async) and
``kernelbake admission review`` (sync). Nothing here raises: every input gets an answer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
from collections.abc import Coroutine, Mapping
from typing import Any

from kernelbake.admission.admit import Endpoint, Plan, decide, plan
from kernelbake.admission.bounds import REVIEW_CPU_SECONDS, Budget, OverBudget
from kernelbake.admission.gateway import Gateway
from kernelbake.admission.gpus import Judge
from kernelbake.admission.policy import AdmissionPolicy
from kernelbake.admission.references import ImageRef
from kernelbake.admission.review import Code, MalformedReview, Response, parse_review
from kernelbake.admission.rules.caches import next_cache_refs
from kernelbake.admission.rules.sites import variant_refs
from kernelbake.admission.subject import Outcome
from kernelbake.admission.variants import Picker
from kernelbake.catalogue import Catalogue, load_catalogue

log = logging.getLogger("kernelbake.admission")


class Admitter:
    def __init__(
        self,
        policy: AdmissionPolicy,
        gateway: Gateway,
        catalogue: Catalogue | None = None,
        *,
        max_waiting: int = 512,
        review_cpu_seconds: float = REVIEW_CPU_SECONDS,
    ) -> None:
        self.policy = policy
        # Each review's CPU budget (``bounds.Budget``): past it, the review is denied.
        self.review_cpu_seconds = review_cpu_seconds
        self.gateway = gateway
        self.judge = Judge(catalogue or load_catalogue(), policy.gpu_match)
        self.picker = Picker(self.judge.catalogue, policy.gpu_match)
        # Reviews of the async path waiting for a verification at once (each holds its
        # document); beyond, a review waits for a slot until its deadline, then is "busy".
        self._slots = asyncio.Semaphore(max_waiting)

    def review(self, doc: Any, endpoint: Endpoint, *, started: float | None = None) -> dict[str, Any]:
        """Answer one parsed AdmissionReview document, waiting for verification at most until
        the policy's deadline."""
        try:
            return self._review(doc, endpoint, time.monotonic() if started is None else started)
        except Exception:
            log.exception("a review failed")
            return _internal(doc).to_document()

    def _review(self, doc: Any, endpoint: Endpoint, started: float) -> dict[str, Any]:
        budget = Budget(self.review_cpu_seconds)
        first = self._plan(doc, budget)
        if isinstance(first, Response):
            return self._answer(first, None)
        outcomes, futures = self._lookup(first.refs)
        asked = set(futures)
        # Twice at most: a GPU index's verdict names the variant to verify next.
        for last in (False, True):
            if futures:
                try:
                    concurrent.futures.wait(futures.values(), timeout=self._remaining(started))
                finally:
                    self.gateway.done_waiting(futures.values())
                outcomes.update(_done(futures))
            if last:
                break
            futures = self._next(first, outcomes, asked)
        return self._decide(first, outcomes, endpoint, budget)

    def review_nowait(
        self, doc: Any, endpoint: Endpoint, *, started: float
    ) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
        """The answer at once when no verification has to run (the common, cached case: no
        task, no thread), else a coroutine that waits for it until the policy's deadline. The
        coroutine must be awaited: until it ends, the review counts as waiting for its
        verifications."""
        futures: dict[str, concurrent.futures.Future[Outcome]] = {}
        budget = Budget(self.review_cpu_seconds)
        try:
            first = self._plan(doc, budget)
            if isinstance(first, Response):
                return self._answer(first, None)
            outcomes, futures = self._lookup(first.refs)
            asked = set(futures)
            if not futures:
                futures = self._next(first, outcomes, asked)
            if not futures:
                return self._decide(first, outcomes, endpoint, budget)
        except Exception:
            log.exception("a review failed")
            self.gateway.done_waiting(futures.values())
            return _internal(doc).to_document()
        return self._wait(doc, first, outcomes, futures, asked, endpoint, started, budget)

    async def _wait(
        self,
        doc: Any,
        first: Plan,
        outcomes: dict[str, Outcome],
        futures: dict[str, concurrent.futures.Future[Outcome]],
        asked: set[str],
        endpoint: Endpoint,
        started: float,
        budget: Budget,
    ) -> dict[str, Any]:
        # What runs after the wait (the next round's picks, the decision) runs on a thread: it
        # is as long as the pod spec, and the event loop serves /healthz and every other review.
        # ``futures`` holds what this review still waits for: each one is given back to the
        # gateway exactly once (when its round ends, else in the last ``finally``), so that a
        # verification shared with other reviews is dropped only when none waits for it.
        try:
            try:
                async with asyncio.timeout(self._remaining(started)):
                    await self._slots.acquire()
            except TimeoutError:
                busy = _refused(
                    first, Code.UNAVAILABLE, "kernelbake admission: too many reviews in flight; try again"
                )
                return self._answer(busy, first)
            try:
                # Twice at most: a GPU index's verdict names the variant to verify next.
                for last in (False, True):
                    pending = [asyncio.wrap_future(f) for f in futures.values() if not f.done()]
                    if pending:
                        await asyncio.wait(pending, timeout=self._remaining(started))
                    held, futures = futures, {}
                    self.gateway.done_waiting(held.values())
                    outcomes.update(_done(held))
                    if last:
                        break
                    futures = await asyncio.to_thread(self._next, first, outcomes, asked)
            finally:
                self._slots.release()
            return await asyncio.to_thread(self._decide, first, outcomes, endpoint, budget)
        except Exception:
            log.exception("a review failed")
            return _internal(doc).to_document()
        finally:
            self.gateway.done_waiting(futures.values())

    def _remaining(self, started: float) -> float:
        return max(0.0, started + self.policy.deadline_seconds - time.monotonic())

    def _next(
        self, first: Plan, outcomes: dict[str, Outcome], asked: set[str]
    ) -> dict[str, concurrent.futures.Future[Outcome]]:
        """The variants GPU indexes pick that have no verdict yet: cached ones go straight
        into ``outcomes``, the rest are submitted (through the same per-registry lanes as any
        verification) and added to ``asked``. One asked already and unfinished is not asked
        again: the review waited for it once and gave it back."""
        following = variant_refs(first.governed, outcomes, self.picker, first.ways)
        if first.caches is not None:
            following.update(next_cache_refs(first.caches, outcomes, first.ways, self.policy, self.judge))
        wanted = {t: r for t, r in following.items() if t not in outcomes and t not in asked}
        found, futures = self._lookup(wanted)
        outcomes.update(found)
        asked.update(futures)
        return futures

    def _lookup(
        self, refs: Mapping[str, ImageRef]
    ) -> tuple[dict[str, Outcome], dict[str, concurrent.futures.Future[Outcome]]]:
        """Cached verdicts at once (the common case, no future, no thread); the rest submitted.
        The caller waits for the futures and gives them back (``Gateway.done_waiting``)."""
        outcomes: dict[str, Outcome] = {}
        futures: dict[str, concurrent.futures.Future[Outcome]] = {}
        try:
            for target, ref in refs.items():
                hit = self.gateway.cached(ref)
                if hit is not None:
                    outcomes[target] = hit
                else:
                    futures[target] = self.gateway.submit(ref)
        except BaseException:
            self.gateway.done_waiting(futures.values())
            raise
        return outcomes, futures

    def _plan(self, doc: Any, budget: Budget) -> Plan | Response:
        try:
            with budget:
                return plan(parse_review(doc), self.policy, budget)
        except MalformedReview as exc:
            return Response.malformed(exc)
        except Exception:
            log.exception("planning a review failed")
            return _internal(doc)

    def _decide(
        self, first: Plan, outcomes: Mapping[str, Outcome], endpoint: Endpoint, budget: Budget
    ) -> dict[str, Any]:
        try:
            with budget:
                response = decide(first, outcomes, self.policy, self.judge, endpoint, self.picker, budget)
        except OverBudget as exc:
            response = _refused(first, Code.BAD_REQUEST, f"kernelbake admission: {exc}")
        except Exception:
            log.exception("deciding a review failed")
            response = _refused(
                first,
                Code.INTERNAL,
                "kernelbake admission: internal error while deciding; see the webhook's log",
            )
        return self._answer(response, first)

    def _answer(self, response: Response, first: Plan | None) -> dict[str, Any]:
        # Refusals and warnings (warn mode's "would deny") at INFO; admissions, patched or not,
        # at DEBUG: the API server's audit log already records each patch, and a log line per
        # admitted pod costs more than the review itself.
        level = logging.INFO if (not response.allowed or response.warnings) else logging.DEBUG
        if log.isEnabledFor(level):
            request = first.request if first is not None else None
            log.log(
                level,
                json.dumps(
                    {
                        "uid": response.uid,
                        "kind": str(request.kind) if request else None,
                        "namespace": request.namespace if request else None,
                        "name": request.name if request else None,
                        "allowed": response.allowed,
                        "message": response.message or None,
                        "patched": len(response.patch),
                        "warnings": len(response.warnings),
                    }
                ),
            )
        return response.to_document()


def _done(futures: Mapping[str, concurrent.futures.Future[Outcome]]) -> dict[str, Outcome]:
    # Missing entries read as "did not finish"; the gateway's jobs catch their own errors.
    return {
        t: f.result() for t, f in futures.items() if f.done() and not f.cancelled() and f.exception() is None
    }


def _refused(first: Plan, code: Code, message: str) -> Response:
    """A denial of the review ``first`` planned, answered in its own uid and apiVersion."""
    return Response(
        uid=first.request.uid,
        api_version=first.request.api_version,
        allowed=False,
        code=code,
        message=message,
    )


def _internal(doc: Any) -> Response:
    request = doc.get("request") if isinstance(doc, Mapping) else None
    uid = request.get("uid") if isinstance(request, Mapping) else ""
    return Response(
        uid=uid if isinstance(uid, str) else "",
        allowed=False,
        code=Code.INTERNAL,
        message="kernelbake admission: internal error while reading the request; see the webhook's log",
    )
