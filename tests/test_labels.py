"""Every dev.kernelbake.* label is derived from the key; an edit to any of them is inconsistent,
and labels outside the key are reported apart, as unattested."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelbake.catalogue import load_catalogue
from kernelbake.contract.key import LABEL_NS, InvalidKey
from kernelbake.labels import GPU_FAMILY_LABEL, GPU_LABEL, GPU_PRODUCTS_LABEL, check_labels, derived_labels
from kernelbake.plan import BuildTarget, plan
from kernelbake.spec import load_spec
from tests.conftest import REPO

TARGETS = [
    *plan(load_spec(REPO / "images/qwen3-0.6b.yaml"), ["all"]),
    *plan(load_spec(REPO / "images/tiny-llama.yaml"), ["cpu"]),
]


def test_device_names_are_unique_so_the_gpu_follows_from_the_key() -> None:
    names = [g.device_name for g in load_catalogue().gpus.values()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_plan_writes_exactly_the_derived_labels(target: BuildTarget) -> None:
    labels = dict(target.labels)
    ours = {n: v for n, v in labels.items() if n.startswith(f"{LABEL_NS}.")}
    assert ours == derived_labels(target.key)
    checked = check_labels(labels)
    assert checked.consistent and checked.key == target.key
    assert checked.gpu == target.gpu and labels[GPU_LABEL] == target.gpu.name
    assert set(checked.derived) == set(ours)
    assert all(not n.startswith(f"{LABEL_NS}.") for n in checked.unattested)


@given(
    target=st.sampled_from(TARGETS),
    data=st.data(),
    value=st.text(min_size=1, max_size=20),
)
def test_any_edited_derived_label_is_inconsistent(
    target: BuildTarget, data: st.DataObject, value: str
) -> None:
    labels = dict(target.labels)
    name = data.draw(st.sampled_from(sorted(derived_labels(target.key))))
    if labels[name] == value:
        return
    labels[name] = value
    try:
        checked = check_labels(labels)
    except InvalidKey:
        return  # one of the key's own labels: the key does not even rebuild
    assert name in (GPU_LABEL, GPU_FAMILY_LABEL, GPU_PRODUCTS_LABEL)
    assert not checked.consistent
    assert any(p.startswith(f"label {name}={value!r}, but the key's device") for p in checked.problems)
    assert checked.gpu == target.gpu  # never taken from the label


def test_relabelled_cpu_image_is_not_an_h100() -> None:
    cpu = next(t for t in TARGETS if t.gpu.is_cpu)
    labels = {**dict(cpu.labels), GPU_LABEL: "h100", "com.example.owner": "someone"}
    checked = check_labels(labels)
    assert checked.gpu is not None and checked.gpu.name == "cpu"
    assert checked.problems == ("label dev.kernelbake.gpu='h100', but the key's device 'cpu' gives 'cpu'",)
    assert checked.unattested["com.example.owner"] == "someone"


def test_gpu_labels_of_a_device_unknown_here_are_unattested() -> None:
    h100 = next(t for t in TARGETS if t.gpu.name == "h100")
    key = h100.key.replace(device="NVIDIA Future GPU")
    labels = {**dict(h100.labels), **key.labels()}
    checked = check_labels(labels)
    assert checked.consistent and checked.gpu is None
    assert checked.unattested[GPU_LABEL] == "h100" and GPU_LABEL not in checked.derived
