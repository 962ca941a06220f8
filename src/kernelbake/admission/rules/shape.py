"""The one shape of what a rule says: ``Denial``s, notes and the patch, in a frozen ``Verdict``.

sigstore-python's verification policies are the model: a rule answers with the reasons it
denies (never a bare bool), and a table of rules that is empty denies everything
(``facts.all_of``): a check that is not there must not read as a check that passed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from kernelbake.admission.frozen import fast_init
from kernelbake.admission.workloads import pointer

PatchOp = Mapping[str, Any]


@fast_init
@dataclasses.dataclass(frozen=True)
class Denial:
    """One reason to deny, as the answer's message shows it: ``where: message; hint``."""

    # What in the object is wrong: 'container "vllm"', 'image volume "cache"', 'annotation …'.
    where: str
    message: str
    # What to do, where the message does not say it.
    hint: str = ""
    # The rule that denies (the name in ``rules.RULES``); set by the table that ran it.
    rule: str = ""
    # The registry could not be asked: an outage, not a verdict. A denial made only of these
    # is answered 503 (``registry_errors`` decides whether it denies at all).
    outage: bool = False

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        return f"{text}; {self.hint}" if self.hint else text

    def of(self, rule: str) -> Denial:
        """This denial filed under ``rule`` (made anew: ``dataclasses.replace`` costs three times
        as much, and a denied review files each of its denials)."""
        return Denial(self.where, self.message, self.hint, rule, self.outage)


@fast_init
@dataclasses.dataclass(frozen=True)
class Verdict:
    """What one rule (or the table) adds to the answer."""

    denials: tuple[Denial, ...] = ()
    notes: tuple[str, ...] = ()
    # RFC 6902 operations (the mutating endpoint's answer).
    patch: tuple[PatchOp, ...] = ()

    @property
    def problems(self) -> tuple[str, ...]:
        return tuple(str(d) for d in self.denials)


EMPTY = Verdict()


def verdict(
    denials: Sequence[Denial] = (), notes: Sequence[str] = (), patch: Sequence[PatchOp] = ()
) -> Verdict:
    """A rule's answer; ``EMPTY`` (which the table skips) when it has nothing to say."""
    if not (denials or notes or patch):
        return EMPTY
    return Verdict(tuple(denials), tuple(notes), tuple(patch))


def append(
    patch: list[dict[str, Any]], obj: Mapping[str, Any], at: tuple[str, ...], field: str, value: Any
) -> None:
    """Add ``value`` to the list ``obj[field]``, creating the list when neither the pod nor an
    earlier op of this patch has it."""
    whole = pointer((*at, field))
    if isinstance(obj.get(field), list) or any(op["path"] == whole for op in patch):
        patch.append({"op": "add", "path": pointer((*at, field, "-")), "value": value})
    else:
        patch.append({"op": "add", "path": whole, "value": [value]})


def joined(patches: Sequence[Sequence[PatchOp]]) -> list[PatchOp]:
    """The rules' patches in order, as one: a list that two rules each created (neither saw the
    other's op) is created once, and the later rule's entries are appended to it."""
    out: list[PatchOp] = []
    created: set[str] = set()
    for patch in patches:
        for op in patch:
            path = op["path"]
            if op["op"] == "add" and isinstance(op["value"], list) and path in created:
                out += [{"op": "add", "path": f"{path}/-", "value": v} for v in op["value"]]
                continue
            if op["op"] == "add" and isinstance(op["value"], list):
                created.add(path)
            out.append(op)
    return out
