"""What every rule reads (``Facts``: the pod walked once, where it can run, what verified) and the
rule itself: a name, a line saying what it denies, and ``check(facts) -> Verdict``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from kernelbake.admission.bounds import Budget
from kernelbake.admission.frozen import fast_init
from kernelbake.admission.gpus import Judge
from kernelbake.admission.pod import Pod
from kernelbake.admission.policy import AdmissionPolicy
from kernelbake.admission.rules.caches import CachePlan
from kernelbake.admission.rules.shape import EMPTY, Denial, Verdict, joined
from kernelbake.admission.rules.sites import Governed, Resolution, resolve
from kernelbake.admission.scheduling import Way
from kernelbake.admission.subject import Outcome, Subjects
from kernelbake.admission.variants import Picker


@fast_init
@dataclasses.dataclass(frozen=True)
class Planned:
    """What the rules that read the pod spec alone found while planning, before any registry was
    asked (a pod they cannot read whole is malformed, and is never verified)."""

    references: Verdict = EMPTY
    trusted_paths: Verdict = EMPTY


NOTHING_PLANNED = Planned()


@fast_init
@dataclasses.dataclass(frozen=True)
class Facts:
    """One review's pod and what verified, read by every rule."""

    pod: Pod
    ways: tuple[Way, ...]
    governed: tuple[Governed, ...]
    planned: Planned
    caches: CachePlan | None
    outcomes: Mapping[str, Outcome]
    # The accepted outcomes by kind, and what each governed site verified as.
    subjects: Subjects
    resolved: tuple[tuple[Governed, Resolution], ...]
    policy: AdmissionPolicy
    judge: Judge
    # The mutating endpoint: the answer carries the patch.
    mutate: bool
    budget: Budget

    @classmethod
    def of(
        cls,
        *,
        pod: Pod,
        ways: Sequence[Way],
        governed: Sequence[Governed],
        planned: Planned,
        caches: CachePlan | None,
        outcomes: Mapping[str, Outcome],
        policy: AdmissionPolicy,
        judge: Judge,
        picker: Picker,
        mutate: bool,
        budget: Budget,
    ) -> Facts:
        resolved = []
        for g in governed:
            budget.check()
            resolved.append((g, resolve(g, outcomes, picker, ways, policy.deadline_seconds)))
        return cls(
            pod,
            tuple(ways),
            tuple(governed),
            planned,
            caches,
            outcomes,
            Subjects.of(outcomes),
            tuple(resolved),
            policy,
            judge,
            mutate,
            budget,
        )


@dataclasses.dataclass(frozen=True)
class Rule:
    """One entry of ``rules.RULES``: ``name`` is what its denials are filed under, ``denies`` the
    line of docs/admission.md's table that says what it denies."""

    name: str
    denies: str
    check: Callable[[Facts], Verdict]


NO_RULES = Denial("", "kernelbake admission has no rules to judge with, and denies what it cannot judge")


def all_of(rules: Sequence[Rule], facts: Facts) -> Verdict:
    """Every rule's verdict, in the table's order, its denials filed under its name. No rules at
    all is a denial: an empty table must not admit everything."""
    if not rules:
        return Verdict((NO_RULES,))
    denials: list[Denial] = []
    notes: list[str] = []
    patches = []
    for rule in rules:
        found = rule.check(facts)
        if found is EMPTY:
            continue
        if found.denials:
            denials += [d if d.rule else d.of(rule.name) for d in found.denials]
        notes += found.notes
        if found.patch:
            patches.append(found.patch)
    if not (denials or notes or patches):
        return EMPTY
    return Verdict(tuple(denials), tuple(notes), tuple(joined(patches)))
