"""target.json: its JSON follows TargetConfig's fields, round-trips, and refuses what it does not know."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given

from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput
from kernelbake.plan import plan
from kernelbake.render import target_config
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.support.strategies import target_configs


@given(target_configs())
def test_target_json_round_trips(config: TargetConfig) -> None:
    text = config.to_json()
    assert TargetConfig.from_json(text) == config
    assert TargetConfig.from_json(text).to_json() == text


def _doc() -> dict[str, object]:
    (t,) = plan(load_spec(REPO / "images" / "qwen3-8b.yaml"), ["h100"])
    doc: dict[str, object] = json.loads(target_config(t).to_json())
    return doc


def test_every_field_is_on_the_wire_under_its_own_name() -> None:
    doc = _doc()
    assert set(doc) == {"schema"} | {f.name for f in dataclasses.fields(TargetConfig)}
    serve = doc["serve"]
    assert isinstance(serve, dict)
    assert serve["compilation_config"] == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert serve["dtype"] == "bfloat16" and serve["env"] == {} and serve["extra_args"] == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(extra=1), r"target\.json: extra: unknown key"),
        (lambda d: d["serve"].update(max_num_sequences=8), r"serve\.max_num_sequences: unknown key"),
        (lambda d: d.pop("gpu"), r"target\.json: gpu: missing"),
        (
            lambda d: d["serve"].update(tensor_parallel_size="2"),
            r"serve\.tensor_parallel_size: expected an integer, got a string",
        ),
        (lambda d: d["serve"].update(tensor_parallel_size=True), r"expected an integer, got a boolean"),
        (
            lambda d: d["serve"].update(dtype="fp4"),
            r"serve\.dtype: unknown value 'fp4' \(expected one of auto, ",
        ),
        (lambda d: d.update(shapes=[[1, 32, 3]]), r"shapes\[0\]: expected 2 items, got 3"),
        (lambda d: d["serve"].update(env={"A": 1}), r"serve\.env\.A: expected a string, got an integer"),
        (lambda d: d.update(key="kb1:nope"), r"target\.json: key: key part 'nope' is not name=value"),
        (lambda d: d.update(schema=2), r"schema 2 is not 1; rebuild the image"),
    ],
)
def test_a_target_file_of_another_shape_is_refused_naming_the_key(change: object, message: str) -> None:
    doc = _doc()
    change(doc)  # type: ignore[operator]
    with pytest.raises(BadInput, match=message):
        TargetConfig.from_json(json.dumps(doc))


def test_fields_with_defaults_may_be_absent() -> None:
    doc = _doc()
    doc.pop("cache_root")
    serve = doc["serve"]
    assert isinstance(serve, dict)
    serve.pop("max_num_seqs")
    config = TargetConfig.from_json(json.dumps(doc))
    assert config.cache_root == "/opt/kernelbake/cache" and config.serve.max_num_seqs == 256


def test_not_json_is_one_line() -> None:
    with pytest.raises(BadInput, match=r"x\.json: not a valid kernelbake target file"):
        TargetConfig.from_json("{", source="x.json")
    with pytest.raises(BadInput, match=r"x\.json: schema None is not 1"):
        TargetConfig.from_json("[]", source="x.json")
