"""Where a pod may be scheduled, as the scheduler reads it.

``ways(pod_spec)`` lists every alternative the pod has: the nodeSelector is ANDed with each
term of the required node affinity; the terms are ORed; the expressions of one term are ANDed.
A term with no expressions matches no node (Kubernetes' rule) and is dropped; ``matchFields``
only names nodes (``metadata.name``) and says nothing about their GPUs. Preferred affinity
never restricts placement and is ignored.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from kernelbake.admission.bounds import MAX_EXPRESSIONS, MAX_NODE_SELECTOR, MAX_TERMS, MAX_VALUES, cap
from kernelbake.admission.frozen import fast_init
from kernelbake.admission.workloads import MalformedObject


class Operator(enum.Enum):
    """A node selector requirement's operator, spelled as in the pod spec."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` entry (or a nodeSelector pair, as ``In``) of a way to schedule."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()
    # ``values`` as a set, for membership in time independent of the list's length (a pod
    # author's In list of thousands, checked against every GPU product).
    value_set: frozenset[str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "value_set", frozenset(self.values))

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Kubernetes' node selector requirement semantics for one node's labels."""
        present = self.key in labels
        value = labels.get(self.key, "")
        match self.operator:
            case Operator.IN:
                return present and value in self.value_set
            case Operator.NOT_IN:
                return not present or value not in self.value_set
            case Operator.EXISTS:
                return present
            case Operator.DOES_NOT_EXIST:
                return not present
            case Operator.GT | Operator.LT:
                # One integer value, compared with the label parsed as an integer; anything
                # else selects no node.
                if not present or len(self.values) != 1:
                    return False
                try:
                    have, bound = int(value), int(self.values[0])
                except ValueError:
                    return False
                return have > bound if self.operator is Operator.GT else have < bound
        raise AssertionError(self.operator)

    def __str__(self) -> str:
        if self.operator is Operator.IN and len(self.values) == 1:
            return f"{self.key}={self.values[0]}"
        if self.operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST):
            return f"{self.key} {self.operator.value}"
        return f"{self.key} {self.operator.value} [{', '.join(self.values)}]"


@fast_init
@dataclasses.dataclass(frozen=True)
class Way:
    """One alternative placement: every requirement must hold on the node."""

    source: str
    requirements: tuple[Requirement, ...]


# Placements larger than this (requirements and values, summed over the ways) are judged afresh
# by each review rather than kept by the shared memos (``gpus.Judge``, ``variants.Picker``): they
# hold 4096 entries each, and 4096 of the largest placements the caps allow would be gigabytes
# (bench/admission_adversarial.py: each 8 MiB placement kept some 45 MiB in a worker).
MEMO_WEIGHT = 1024


def weight(ways: Sequence[Way]) -> int:
    """The requirements and values of ``ways``: what a memo entry keyed by them holds."""
    total = 0
    for w in ways:
        for r in w.requirements:
            total += 1 + len(r.values)
    return total


def ways(spec: Mapping[str, Any]) -> list[Way]:
    selector = _node_selector(spec.get("nodeSelector"))
    terms = _required_terms(spec.get("affinity"))
    if terms is None:
        source = "its nodeSelector" if selector else "the pod (no nodeSelector, no required node affinity)"
        return [Way(source, selector)]
    prefix = "its nodeSelector + " if selector else "its "
    out = []
    for i, term in enumerate(terms):
        expressions = _expressions(term.get("matchExpressions"), f"nodeSelectorTerms[{i}].matchExpressions")
        fields = term.get("matchFields")
        if fields is not None and not isinstance(fields, list):
            raise MalformedObject(f"nodeSelectorTerms[{i}].matchFields must be a list")
        if not expressions and not fields:
            continue
        out.append(Way(f"{prefix}required node affinity term {i + 1}", selector + expressions))
    return out


def _node_selector(value: Any) -> tuple[Requirement, ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise MalformedObject("nodeSelector must map label names to strings")
    # Loops, not all() and tuple() over generators: every review with a nodeSelector passes here.
    for k, v in value.items():
        if not (isinstance(k, str) and isinstance(v, str)):
            raise MalformedObject("nodeSelector must map label names to strings")
    cap("nodeSelector", list(value), MAX_NODE_SELECTOR)
    out = []
    for k, v in value.items():
        out.append(Requirement(k, Operator.IN, (v,)))
    return tuple(out)


def _required_terms(affinity: Any) -> list[Mapping[str, Any]] | None:
    if affinity is None:
        return None
    if not isinstance(affinity, dict):
        raise MalformedObject("affinity must be an object")
    node_affinity = affinity.get("nodeAffinity")
    if node_affinity is None:
        return None
    if not isinstance(node_affinity, dict):
        raise MalformedObject("affinity.nodeAffinity must be an object")
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    if not isinstance(required, dict):
        raise MalformedObject("requiredDuringSchedulingIgnoredDuringExecution must be an object")
    terms = required.get("nodeSelectorTerms")
    if not isinstance(terms, list) or not all(isinstance(t, dict) for t in terms):
        raise MalformedObject(
            "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms must be a list of objects"
        )
    cap("requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms", terms, MAX_TERMS)
    return terms


def _expressions(value: Any, where: str) -> tuple[Requirement, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise MalformedObject(f"{where} must be a list")
    cap(where, value, MAX_EXPRESSIONS)
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise MalformedObject(f"{where}[{i}] must be an object with a key")
        try:
            operator = Operator(item.get("operator"))
        except ValueError:
            raise MalformedObject(
                f"{where}[{i}].operator {item.get('operator')!r} is not one of "
                f"{', '.join(o.value for o in Operator)}"
            ) from None
        values = item.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise MalformedObject(f"{where}[{i}].values must be a list of strings")
        cap(f"{where}[{i}].values", values, MAX_VALUES)
        out.append(Requirement(item["key"], operator, tuple(values)))
    return tuple(out)
