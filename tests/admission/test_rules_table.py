"""What admission denies is one table: every rule module is in ``RULES`` once, docs/admission.md's
table is the one ``make docs`` writes from it, the table runs every rule and files each denial
under the rule that made it, and an empty table denies."""

from __future__ import annotations

import copy
import importlib
import pkgutil
from typing import Any

import pytest

import kernelbake.admission.rules as rules
from kernelbake.admission import admit
from kernelbake.admission.bounds import UNBOUNDED
from kernelbake.admission.review import parse_review
from kernelbake.admission.rules import RULES, table
from kernelbake.admission.rules.facts import NO_RULES, Facts, all_of
from kernelbake.admission.variants import Picker
from kernelbake.contract.key import CacheKey
from kernelbake.errors import BadInput
from tests.admission import documents
from tests.admission.fakes import REPO, FakeVerifier, make_admitter
from tests.conftest import REPO as SOURCE_TREE


def test_the_committed_table_is_the_one_make_docs_writes() -> None:
    text = (SOURCE_TREE / table.DOC).read_text()
    if table.rewritten(text) != text:
        pytest.fail(f"{table.DOC}'s rules table is stale: run `make docs`")


def test_every_rule_module_is_in_the_table_once_under_a_name_of_its_own() -> None:
    modules = {
        f"{rules.__name__}.{m.name}"
        for m in pkgutil.iter_modules(rules.__path__)
        if hasattr(importlib.import_module(f"{rules.__name__}.{m.name}"), "RULE")
    }
    assert len(modules) >= 9  # the package was read
    assert sorted(r.check.__module__ for r in RULES) == sorted(modules)
    assert len({r.name for r in RULES}) == len(RULES)
    # One row each: a line of its own, no cell border inside.
    assert all(r.denies and "|" not in r.denies and "\n" not in r.denies for r in RULES)


def test_the_table_cannot_be_written_without_its_markers() -> None:
    with pytest.raises(BadInput, match="put them back"):
        table.rewritten("# Admission\n\nno markers here\n")
    written = table.rewritten(f"before\n{table.BEGIN}\nold rows\n{table.END}\nafter\n")
    assert written.startswith("before\n") and written.endswith("\nafter\n") and "old rows" not in written
    assert all(f"| `{r.name}` |" in written for r in RULES)


def _facts(keys: dict[str, CacheKey], doc: dict[str, Any]) -> Facts:
    """The facts ``admit.decide`` gives the rules for ``doc``, verified by the fake registry."""
    verifier = FakeVerifier()
    verifier.add(f"{REPO}:h100", keys["h100"])
    admitter = make_admitter(verifier)
    try:
        first = admit.plan(parse_review(doc), admitter.policy)
        assert first.pod is not None and first.final is None
        outcomes = {t: admitter.gateway.submit(r).result(10) for t, r in first.refs.items()}
    finally:
        admitter.gateway.close()
    return Facts.of(
        pod=first.pod,
        ways=first.ways,
        governed=first.governed,
        planned=first.planned,
        caches=first.caches,
        outcomes=outcomes,
        policy=admitter.policy,
        judge=admitter.judge,
        picker=Picker(admitter.judge.catalogue, admitter.policy.gpu_match),
        mutate=True,
        budget=UNBOUNDED,
    )


def test_each_denial_is_filed_under_the_rule_that_made_it(keys: dict[str, CacheKey]) -> None:
    doc = documents.load("pod-create", f"{REPO}:h100")
    documents.schedule(doc, node_selector={"nvidia.com/gpu.product": "NVIDIA-L4"})
    spec = documents.pod_spec(doc)
    spec["containers"].append(
        {**copy.deepcopy(spec["containers"][0]), "name": "x", "image": f"{REPO}:unsigned"}
    )
    found = all_of(RULES, _facts(keys, doc))
    assert sorted({d.rule for d in found.denials}) == ["gpu", "signature"]
    (unsigned,) = [d for d in found.denials if d.rule == "signature"]
    assert str(unsigned).startswith(f'container "x": image {REPO}:unsigned was rejected')
    (gpu,) = [d for d in found.denials if d.rule == "gpu"]
    assert gpu.hint.startswith("add nodeSelector nvidia.com/gpu.product: NVIDIA-H100")


def test_an_empty_table_denies_what_a_full_one_admits(keys: dict[str, CacheKey]) -> None:
    facts = _facts(keys, documents.load("pod-create", f"{REPO}:h100"))
    admitted = all_of(RULES, facts)
    assert admitted.denials == () and admitted.patch  # verified, pinned
    assert all_of((), facts).denials == (NO_RULES,)
