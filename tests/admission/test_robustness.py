"""Whatever arrives, the core answers with a well-formed AdmissionReview and never a 500."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelbake.admission.admit import Endpoint
from kernelbake.admission.service import Admitter
from tests.admission import documents
from tests.admission.fakes import REPO, FakeVerifier, make_admitter

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


BASES = [
    documents.load(name, f"{REPO}:h100") for name in ("pod-create", "deployment-create", "cronjob-create")
]
PATHS = [(i, p) for i, base in enumerate(BASES) for p in _paths(base) if p]


@pytest.fixture
def admitter(verifier: FakeVerifier) -> Iterator[Admitter]:
    a = make_admitter(verifier)
    yield a
    a.gateway.close()


def check_answer(answer: dict[str, Any]) -> None:
    assert set(answer) == {"apiVersion", "kind", "response"}
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert isinstance(response["uid"], str) and isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["code"] in (400, 403, 503), response
        assert response["status"]["message"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=json_values)
def test_any_json_gets_an_answer(admitter: Admitter, doc: Any) -> None:
    check_answer(admitter.review(doc, Endpoint.MUTATE))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(PATHS), value=json_values, endpoint=st.sampled_from(list(Endpoint)))
def test_real_documents_with_any_part_replaced_get_an_answer(
    admitter: Admitter, where: tuple[int, tuple[Any, ...]], value: Any, endpoint: Endpoint
) -> None:
    index, path = where
    doc = copy.deepcopy(BASES[index])
    node = doc
    for segment in path[:-1]:
        node = node[segment]
    node[path[-1]] = value
    check_answer(admitter.review(doc, endpoint))
