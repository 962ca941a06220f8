"""bench/snapshot_caps.py: what its measured runs say is needed, and the set it measures is the
one the product asks for (the recipe, make snapshot, bench/snapshot_cpu.py)."""

from __future__ import annotations

import json
import re

import yaml

from kernelbake.contract.snapshot import RESTORE_CAPABILITIES, SNAPSHOT_CAPABILITIES
from tests.conftest import REPO
from tests.support import bench


def test_a_capability_is_needed_by_the_steps_that_fail_without_it() -> None:
    caps = bench.load("snapshot_caps")
    ok, failed = {"ok": True}, {"ok": False}
    steps = {
        "take": {"all": ok, "without A": failed, "without B": ok, "without C": ok},
        "restore": {"all": ok, "without A": failed, "without B": ok, "without C": failed},
    }
    assert caps.needed(steps, "all") == {"take": ["A"], "restore": ["A", "C"]}


def test_the_measured_set_is_the_one_the_recipe_make_snapshot_and_the_benches_use() -> None:
    assert (
        set(bench.load("snapshot_cpu").CAPS) == SNAPSHOT_CAPABILITIES == set(bench.load("snapshot_caps").CAPS)
    )
    assert RESTORE_CAPABILITIES < SNAPSHOT_CAPABILITIES
    recipe = yaml.safe_load((REPO / "deploy/examples/serve-snapshot.yaml").read_text())
    (container,) = recipe["spec"]["template"]["spec"]["containers"]
    asked = container["securityContext"]["capabilities"]
    assert asked["drop"] == ["ALL"] and set(asked["add"]) == SNAPSHOT_CAPABILITIES
    make = (REPO / "mk/snapshot.mk").read_text()
    args = re.search(r"SNAPSHOT_DOCKER_ARGS \?=(.*?)\n\n", make, re.S)
    assert args is not None
    assert "--cap-drop ALL" in args.group(1)
    assert set(re.findall(r"--cap-add (\w+)", args.group(1))) == SNAPSHOT_CAPABILITIES


def test_the_set_is_what_the_committed_measurements_needed_no_more_no_less() -> None:
    """Every capability of the set was needed by take or a restore under one of the runtimes
    measured (bench/results/snapshot_caps*.json), each with the whole set, and restored with it."""
    results = [
        json.loads(p.read_text()) for p in sorted((REPO / "bench/results").glob("snapshot_caps*.json"))
    ]
    assert {r["restore_with"] for r in results} == {"docker", "podman"}
    for r in results:
        assert set(r["set"]) == SNAPSHOT_CAPABILITIES and r["summary"]["restored_with_the_set"], r["summary"]
    assert set().union(*(r["summary"]["needed"] for r in results)) == SNAPSHOT_CAPABILITIES
