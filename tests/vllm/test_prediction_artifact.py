"""Which cache switches keep vLLM from its baked AOT artifact, as the release's adapter says its
load reads them (``_v0_26.aot_artifact_of``), checked against what vLLM did on the H200.

On 0.26 with torch 2.11 the artifact holds the traced graph, which vLLM compiles again through
its per-graph cache and Inductor's caches: Inductor's FX-graph cache off, its caches force-
disabled or ``compilation_config.cache_dir`` elsewhere each compiled (the 0.26 key matrix). On
0.32 with torch 2.13 vLLM's mega artifact holds Inductor's compiled graphs and the same three
started warm (the 0.32 key matrix): the 0.26 rule predicted ``bypassed`` for all three.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from kernelbake.runtime.engines.vllm._v0_26 import aot_artifact_of
from kernelbake.runtime.prediction import Change, Outcome, Store, artifact_bypass, predict
from tests.conftest import REPO
from tests.support import bench

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
IDENTITIES = {
    "0.26.0": FIXTURES / "h200-0.26.0-identities.json",
    "0.32.0": FIXTURES / "h200-0.32.0-identities.json",
}
MATRICES = {
    "0.26.0": REPO / "bench/results/vllm-0.26.0-h200-keymatrix.json",
    "0.32.0": REPO / "bench/results/vllm-0.32.0-h200-2026-12-05/keymatrix/vllm-0.32.0-h200-keymatrix.json",
}
# What each case sets, as torch and vLLM answered it in the matrices' reasons (switches by
# the name identity.compile_state gives them; the directory vLLM's config named).
CASES = {
    "inductor-fx-graph-cache-off": {"switches": {"torch._inductor.config.fx_graph_cache": False}},
    "inductor-force-disable-caches": {"switches": {"vllm is_compile_cache_enabled": False}},
    "vllm-compile-cache-dir-elsewhere": {
        "dirs": {"vllm compilation_config.cache_dir": "/tmp/kb-other-compile-cache"}
    },
}
# The 0.26 identities predate the recorded switches: the state every H200 start had.
_STATE = {
    "mode": "VLLM_COMPILE",
    "backend": "inductor",
    "switches": {"torch._inductor.config.fx_graph_cache": True, "vllm is_compile_cache_enabled": True},
    "dirs": {"inductor": "/opt/kernelbake/cache/inductor", "vllm": "/opt/kernelbake/cache/vllm"},
}


def _identities(release: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(IDENTITIES[release].read_text())
    return doc


def _actual(release: str, case: str) -> str:
    doc = json.loads(MATRICES[release].read_text())
    return str(next(c["actual"] for c in doc["cases"] if c["name"] == case))


def _with(
    doc: dict[str, Any], switches: dict[str, Any] | None = None, dirs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``doc`` with its compile state (recorded, or the H200's) changed as a case changes it,
    and what the release's adapter says the artifact load reads, from the variables vLLM
    recorded in the same identity."""
    out = copy.deepcopy(doc)
    state = out.setdefault("compile", copy.deepcopy(_STATE))
    state["switches"].update(switches or {})
    state["dirs"].update(dirs or {})
    state["artifact"] = aot_artifact_of(out["env"]["factors"])
    out["graphs"] = "vllm"
    return out


@pytest.mark.parametrize("release", ["0.26.0", "0.32.0"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_switch_the_artifact_load_does_not_read_keeps_it_warm(release: str, case: str) -> None:
    ids = _identities(release)
    baked = _with(ids["baked"])
    now = _with(ids["cases"]["baseline"]["identity"], **CASES[case])
    p = predict(baked, now, ids["kinds"])
    expected = bench.load("keymatrix_cases").EXPECTED
    actual = _actual(release, case)
    assert actual in expected[p.predicted], (release, case, p.predicted, actual, p.lines())
    if release == "0.26.0":
        assert p.predicted == "bypassed"
    else:
        vllm = p.kind("vllm")
        assert p.hit and vllm is not None and vllm.outcome is Outcome.HIT
        # Said, with the setting named, though it changes nothing for this start.
        (setting,) = CASES[case].values()
        assert "without reading" in vllm.note and all(name in vllm.note for name in setting)


def test_the_adapter_reads_the_artifact_alone_where_vllm_made_a_mega_artifact() -> None:
    on_032 = _identities("0.32.0")["baked"]["env"]["factors"]
    on_026 = _identities("0.26.0")["baked"]["env"]["factors"]
    assert on_032["VLLM_USE_MEGA_AOT_ARTIFACT"] is True and on_026["VLLM_USE_MEGA_AOT_ARTIFACT"] is False
    assert aot_artifact_of(on_032) == {"loads": True, "reads": [Store.ARTIFACT.value]}
    assert aot_artifact_of(on_026)["reads"] == [
        s.value for s in (Store.ARTIFACT, Store.GRAPH_CACHE, Store.INDUCTOR)
    ]
    # VLLM_DISABLE_COMPILE_CACHE=1 with AOT compile forced on: the decorator skips the load.
    assert aot_artifact_of({**on_032, "VLLM_DISABLE_COMPILE_CACHE": True})["loads"] is False


def test_a_skipped_load_or_the_cache_root_elsewhere_bypasses_even_a_mega_artifact() -> None:
    ids = _identities("0.32.0")
    baked = _with(ids["baked"])
    moved = _with(ids["cases"]["baseline"]["identity"], dirs={"vllm": "/tmp/elsewhere"})
    assert predict(baked, moved, ids["kinds"]).predicted == "bypassed"
    skipped = _with(ids["cases"]["baseline"]["identity"], switches={"vllm is_compile_cache_enabled": False})
    skipped["compile"]["artifact"]["loads"] = False
    p = predict(baked, skipped, ids["kinds"])
    assert p.predicted == "bypassed"
    assert "vllm: vLLM's AOT artifact load: tried → skipped (VLLM_DISABLE_COMPILE_CACHE)" in p.reasons


def test_a_switch_recorded_without_what_the_load_reads_still_bypasses() -> None:
    # An identity from an older kernelbake: fail closed, as on 0.26.
    switch = Change("torch._inductor.config.fx_graph_cache", "True", "False")
    assert artifact_bypass({"compile": {}}, [switch]) == ([switch], [])
    unknown = Change("some future cache switch", "True", "False")
    now = {"compile": {"artifact": {"loads": True, "reads": [Store.ARTIFACT.value]}}}
    assert artifact_bypass(now, [switch, unknown]) == ([unknown], [switch])


def test_settings_vllm_refuses_where_it_builds_its_compiler_fail_the_start() -> None:
    # 0.32 on the H200: VLLM_USE_STANDALONE_COMPILE=0 under the default mega artifact; vLLM's
    # make_compiler asserts, and so does the engine core at start (the matrix's serve.log).
    ids = _identities("0.32.0")
    now = _with(ids["cases"]["baseline"]["identity"])
    why = "AssertionError: VLLM_USE_MEGA_AOT_ARTIFACT=1 requires VLLM_USE_STANDALONE_COMPILE=1"
    now["compiler"] = {"refused": why}
    p = predict(_with(ids["baked"]), now, ids["kinds"])
    assert p.predicted == "fails" and not p.hit
    assert {k.outcome for k in p.kinds} == {Outcome.FAILS}
    assert f"vllm: vLLM's compiler: built → {why}" in p.reasons
    # With compilation off the compiler is never built: nothing fails.
    now["compile"]["mode"] = "NONE"
    assert predict(_with(ids["baked"]), now, ids["kinds"]).predicted == "no-compile"
