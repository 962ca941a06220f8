"""Warm or cold as one value: a reason makes a decision cold, none makes it warm, and the
preflight's verdict carries the decision with its reasons in the order its steps found them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbake.contract.layout import CacheKind, kind_dir
from kernelbake.contract.target import TargetConfig
from kernelbake.runtime.compile.stage import run_compile
from kernelbake.runtime.serve import preflight as pf
from kernelbake.runtime.serve.decision import Decision, Start
from tests.support.fake_engine import FakeEngine, pin_manifest, platform_for
from tests.support.runtime_target import runtime_env as _env
from tests.support.runtime_target import write_target


def test_a_decision_is_cold_exactly_when_it_holds_a_reason() -> None:
    assert Decision.of(()).start is Start.WARM
    cold = Decision.of(["KERNELBAKE_CACHE=off"])
    assert (cold.start, cold.reasons, cold.warm) == (Start.COLD, ("KERNELBAKE_CACHE=off",), False)
    with pytest.raises(ValueError, match="a warm start with 1 reasons"):
        Decision(Start.WARM, ("KERNELBAKE_CACHE=off",))
    with pytest.raises(ValueError, match="a cold start with 0 reasons"):
        Decision(Start.COLD)


def test_a_later_step_adds_its_reasons_after_the_earlier_ones() -> None:
    warm = Decision.of(())
    assert warm.ruled_out(()) == warm
    cold = warm.ruled_out(["arch: baked 'sm_90', found 'sm_80'"]).ruled_out(["cache integrity: a", "b"])
    assert cold.reasons == ("arch: baked 'sm_90', found 'sm_80'", "cache integrity: a", "b")
    assert not cold.warm


@pytest.fixture
def target(tmp_path: Path) -> TargetConfig:
    target = write_target(tmp_path, "tiny-llama-torch.yaml")
    run_compile(_env(tmp_path, KERNELBAKE_BUILDER="test-host"), engine=FakeEngine(platform_for(target.key)))
    pin_manifest(tmp_path / "target.json")
    return target


def test_the_verdict_holds_the_decision_with_each_step_s_reasons(
    tmp_path: Path, target: TargetConfig
) -> None:
    engine = FakeEngine(platform_for(target.key))
    warm = pf.preflight(_env(tmp_path), engine=engine)
    assert warm.decision == Decision.of(()) and warm.to_json()["verdict"] == "warm"

    graph = kind_dir(Path(target.cache_root), CacheKind.INDUCTOR) / "g0" / "graph.bin"
    graph.write_bytes(graph.read_bytes() + b"x")
    other = FakeEngine(platform_for(target.key, torch="2.12.0"))
    cold = pf.preflight(_env(tmp_path, KERNELBAKE_CACHE="off"), engine=other)
    # The platform's reasons, then the switch; the sha256 check is cancelled once the caches
    # are ruled out, so the changed file is not among them.
    assert cold.decision.reasons == (
        "torch: baked '2.13.0', found '2.12.0' (Inductor caches are keyed by the torch version)",
        "KERNELBAKE_CACHE=off: starting cold on purpose",
    )
    assert cold.problems == cold.decision.reasons and cold.to_json()["verdict"] == "cold"
    changed = pf.preflight(_env(tmp_path), engine=engine)
    assert [r.split(":")[0] for r in changed.decision.reasons] == ["cache integrity"]
    assert "g0/graph.bin" in changed.problems[0]
