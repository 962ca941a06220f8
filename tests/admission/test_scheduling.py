from __future__ import annotations

from typing import Any

import pytest

from kernelbake.admission.scheduling import Operator, Requirement, ways
from kernelbake.admission.workloads import MalformedObject
from tests.admission.documents import expr


def affinity(*terms: Any) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


@pytest.mark.parametrize(
    ("operator", "values", "labels", "expected"),
    [
        ("In", ["a", "b"], {"k": "b"}, True),
        ("In", ["a"], {}, False),
        ("NotIn", ["a"], {}, True),
        ("NotIn", ["a"], {"k": "a"}, False),
        ("Exists", [], {"k": ""}, True),
        ("DoesNotExist", [], {"k": "x"}, False),
        ("Gt", ["8"], {"k": "9"}, True),
        ("Gt", ["9"], {"k": "9"}, False),
        ("Lt", ["9"], {"k": "8"}, True),
        ("Gt", ["x"], {"k": "9"}, False),
        ("Gt", ["8"], {"k": "nine"}, False),
        ("Lt", ["8", "9"], {"k": "1"}, False),
        ("Gt", ["1"], {}, False),
    ],
)
def test_requirements_follow_kubernetes(
    operator: str, values: list[str], labels: dict[str, str], expected: bool
) -> None:
    assert Requirement("k", Operator(operator), tuple(values)).matches(labels) is expected


def test_node_selector_is_anded_into_every_ored_term() -> None:
    spec = {
        "nodeSelector": {"pool": "gpu"},
        "affinity": affinity(
            {"matchExpressions": [expr("a", "In", "1"), expr("b", "Exists")]},
            {"matchExpressions": [expr("c", "NotIn", "2")]},
        ),
    }
    found = ways(spec)
    assert [w.source for w in found] == [
        "its nodeSelector + required node affinity term 1",
        "its nodeSelector + required node affinity term 2",
    ]
    assert [len(w.requirements) for w in found] == [3, 2]
    assert all(w.requirements[0] == Requirement("pool", Operator.IN, ("gpu",)) for w in found)


def test_empty_terms_match_no_node_and_fields_only_terms_pin_nothing() -> None:
    spec = {
        "affinity": affinity(
            {}, {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        )
    }
    found = ways(spec)
    assert len(found) == 1
    assert found[0].requirements == ()
    assert ways({"affinity": affinity({})}) == []


def test_no_constraint_is_one_unconstrained_way_and_preferred_is_ignored() -> None:
    preferred = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}}
    specs: list[dict[str, Any]] = [{}, {"affinity": preferred}, {"affinity": {"podAntiAffinity": {}}}]
    for spec in specs:
        found = ways(spec)
        assert len(found) == 1 and found[0].requirements == ()


@pytest.mark.parametrize(
    "spec",
    [
        {"nodeSelector": ["nvidia.com/gpu.product"]},
        {"nodeSelector": {"a": 1}},
        {"affinity": "x"},
        {"affinity": {"nodeAffinity": []}},
        {"affinity": affinity({"matchExpressions": [expr("a", "Is", "1")]})},
        {"affinity": affinity({"matchExpressions": [{"operator": "In"}]})},
        {"affinity": affinity({"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]})},
        {
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": {}}}
            }
        },
    ],
)
def test_malformed_constraints_are_bad_input(spec: dict[str, Any]) -> None:
    with pytest.raises(MalformedObject):
        ways(spec)
