"""The torch engine asks its own parts: the server's parser for the shapes, Inductor for its
cache factors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kernelbake.contract.target import TargetConfig
from kernelbake.plan import plan
from kernelbake.render import target_config
from kernelbake.runtime.engines import torch_engine
from kernelbake.runtime.engines.torch_engine import TorchEngine
from kernelbake.runtime.prediction import Outcome
from kernelbake.spec import load_spec
from tests.conftest import REPO


@pytest.fixture
def target(tmp_path: Path) -> TargetConfig:
    spec = load_spec(REPO / "images" / "tiny-llama-torch.yaml")
    (t,) = plan(spec, ["cpu"])
    return dataclasses.replace(target_config(t), cache_root=str(tmp_path), shapes=((1, 32), (1, 128)))


@pytest.mark.parametrize("args", [["--shapes", "1x32,1x128"], ["--shapes=1x128"], ["--port", "9000"], []])
def test_the_baked_shapes_repeated_or_a_subset_do_not_warn(target: TargetConfig, args: list[str]) -> None:
    assert TorchEngine().shape_args(target, args) == []


def test_a_shape_outside_the_baked_ones_is_named(target: TargetConfig) -> None:
    (warning,) = TorchEngine().shape_args(target, ["--shapes", "1x32,4x64"])
    assert warning.startswith("--shapes 4x64 are not among the baked shapes")


def _bake(target: TargetConfig, identity: dict[str, object]) -> None:
    manifest = {
        "compile_report": {"engine_identity": identity},
        "files": [{"path": "inductor/x", "kind": "inductor", "size": 1, "sha256": "0"}],
    }
    (Path(target.cache_root) / "manifest.json").write_text(json.dumps(manifest))


def test_a_changed_inductor_factor_is_named(target: TargetConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    baked = {"system": {"hash": "s"}, "torch_key": "t", "config": {"max_autotune": "False"}}
    monkeypatch.setattr(torch_engine, "inductor_identity", lambda: baked)
    _bake(target, baked)
    p = TorchEngine().predict(target, ["--shapes", "1x32"], {})
    assert p is not None and p.hit
    assert p.kind("triton").outcome is Outcome.EMPTY  # type: ignore[union-attr]
    _bake(target, {**baked, "config": {"max_autotune": "True"}})
    p = TorchEngine().predict(target, ["--shapes", "4x4"], {})
    assert p is not None and not p.hit
    assert [c.factor for c in p.kind("inductor").changes] == [  # type: ignore[union-attr]
        "inductor.config.max_autotune",
        "--shapes",
    ]
