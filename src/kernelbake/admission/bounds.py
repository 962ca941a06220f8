"""What one review may cost: caps on the lists of a pod spec, a CPU budget, and denial
messages of a few KiB however many problems a pod has.

Every step of a review is linear in its body; the caps keep the products of lists that a pod
author chooses (GPU products by placement terms, cache volumes by the containers that use them)
small, and a pod past one is denied with the field and the cap (fail closed: it is not
reviewed, so it is not admitted). The budget is the backstop for whatever the caps miss: a
review that spends more than ``REVIEW_CPU_SECONDS`` of CPU is denied.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from kernelbake.admission.workloads import MalformedObject

# Governed images of one pod (containers of every kind and image volumes): each is verified,
# judged against every placement and pinned. Real pods have a handful.
MAX_GOVERNED = 256
# Governed image volumes of one pod: each cache artifact is checked against every container
# that mounts it or anything at or under the cache root, so volumes times containers is bounded by this.
MAX_CACHE_VOLUMES = 16
# Placement (scheduling.ways): the terms are ORed, so each is judged on its own.
MAX_TERMS = 64
MAX_EXPRESSIONS = 64
MAX_VALUES = 1024
MAX_NODE_SELECTOR = 256
# The denial message and the warnings (the API server shows both to the user, and the webhook
# logs the message).
MESSAGE_BYTES = 4096
MAX_WARNINGS = 32
REVIEW_CPU_SECONDS = 2.0
# Problems one review collects before its per-container checks stop: the message names a few
# per cause, and past this many the pod is denied anyway. Without it, 16 cache volumes times
# 38,000 containers (an 8 MiB body) made 600,000 problem strings, 240 MiB in one worker.
MAX_PROBLEMS = 1024
# Connections one worker holds at once, TLS handshakes included (``_uvicorn.BoundedTLS``): each
# costs some 60 KiB at rest and up to 64 KiB more while a request head arrives, so 512 stay
# under 64 MiB a worker. The API server keeps a few per webhook; ``--max-connections`` changes it.
MAX_CONNECTIONS = 512
# Problems named one by one per cause before "and N more".
_NAMED = 3


class OverLimit(MalformedObject):
    """A list of the pod spec is longer than admission reviews (answered with code 400)."""


def cap(where: str, items: Sequence[object], limit: int) -> None:
    if len(items) > limit:
        raise OverLimit(
            f"{where} has {len(items)} entries; kernelbake admission reviews at most {limit} "
            "(a bound on the work of one review)"
        )


def stopped(limit: int = MAX_PROBLEMS) -> str:
    """The last problem of a review whose checks stopped at ``limit`` problems."""
    return (
        f"kernelbake admission stopped checking after {limit} problems (a bound on the work of "
        "one review); fix these and apply again"
    )


class OverBudget(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"the review took more than {seconds:g} s of CPU, the bound on one review; "
            "kernelbake admission denies what it cannot finish reviewing"
        )


class Budget:
    """CPU seconds one review may spend, across the threads it runs on (plan on one, decide on
    another). ``check`` reads the clock every ``every`` calls: cheap enough for per-item loops."""

    def __init__(
        self,
        seconds: float = REVIEW_CPU_SECONDS,
        *,
        clock: Callable[[], float] = time.thread_time,
        every: int = 64,
    ) -> None:
        self.seconds, self._clock, self._every = seconds, clock, every
        self._spent = 0.0
        self._since: float | None = None
        self._calls = 0

    def __enter__(self) -> Budget:
        self._since = self._clock()
        self._calls = 0
        return self

    def __exit__(self, *exc: object) -> None:
        if self._since is not None:
            self._spent += self._clock() - self._since
            self._since = None

    def check(self) -> None:
        """Raise ``OverBudget`` once the review has spent its CPU seconds (the clock is read
        on the first call of each stretch, then every ``every`` calls)."""
        self._calls += 1
        if (self._calls - 1) % self._every:
            return
        running = self._clock() - self._since if self._since is not None else 0.0
        if self._spent + running > self.seconds:
            raise OverBudget(self.seconds)


UNBOUNDED = Budget(float("inf"), clock=lambda: 0.0, every=1 << 30)


def message(problems: Iterable[str], *, limit: int = MESSAGE_BYTES) -> str:
    """``problems`` as one message of at most ``limit`` bytes (UTF-8): one entry per distinct
    cause, the causes being what follows a problem's subject (``container "a": runs X`` and
    ``container "b": runs X`` are one cause for two containers), in order of first appearance."""
    causes: dict[str, list[str]] = {}
    count = 0
    for problem in problems:
        count += 1
        subject, sep, cause = problem.partition(": ")
        if not sep:
            subject, cause = "", problem
        causes.setdefault(cause, []).append(subject)
    parts: list[str] = []
    size = 0
    shown = 0
    for cause, subjects in causes.items():
        part = _grouped(cause, subjects)
        if size + len(part.encode()) + 2 > limit - 80:
            break
        parts.append(part)
        size += len(part.encode()) + 2
        shown += len(subjects)
    if not parts and causes:
        # One cause alone is longer than the message may be: its start.
        first, subjects = next(iter(causes.items()))
        parts.append(_clip(_grouped(first, subjects), limit - 80))
        shown = len(subjects)
    text = "; ".join(parts)
    if shown < count:
        text += f"; … and {count - shown} more problems ({count} in all)"
    return text


def _grouped(cause: str, subjects: list[str]) -> str:
    named = [s for s in dict.fromkeys(subjects) if s]
    if not named:
        return cause if len(subjects) == 1 else f"{cause} ({len(subjects)} times)"
    shown = ", ".join(_clip(s, 200) for s in named[:_NAMED])
    more = f" and {len(named) - _NAMED} more" if len(named) > _NAMED else ""
    return f"{shown}{more}: {cause}"


def _clip(text: str, limit: int) -> str:
    if len(text.encode()) <= limit:
        return text
    return text.encode()[: limit - 3].decode(errors="ignore") + "…"


def warnings(notes: Sequence[str], *, limit: int = MAX_WARNINGS) -> tuple[str, ...]:
    """At most ``limit`` warnings, duplicates once, the last saying how many were left out."""
    unique = list(dict.fromkeys(notes))
    if len(unique) <= limit:
        return tuple(unique)
    return (*unique[: limit - 1], f"kernelbake: {len(unique) - limit + 1} more warnings left out")
