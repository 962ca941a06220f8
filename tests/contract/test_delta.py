"""The delta manifest: canonical JSON that round-trips, and a model that refuses unsafe or
unbounded content however it was built (from JSON or in code)."""

from __future__ import annotations

import json

import pytest

from kernelbake.contract import delta as d
from kernelbake.contract.layout import CacheKind
from tests.support.runtime_target import write_target

SHA = "a" * 64
BASE = "sha256:" + "b" * 64


def _delta(tmp_path, *files: d.DeltaFile) -> d.DeltaManifest:  # type: ignore[no-untyped-def]
    key = write_target(tmp_path, "tiny-llama.yaml").key
    return d.DeltaManifest(key=key, base_image=None, base_manifest=BASE, files=files, replica="r")


def test_the_json_round_trips_and_names_the_engines_keys(tmp_path) -> None:  # type: ignore[no-untyped-def]
    files = (
        d.DeltaFile(path="triton/K1/a.cubin", size=3, sha256=SHA, kind=CacheKind.TRITON),
        d.DeltaFile(path="vllm/torch_compile_cache/H1/rank_0_0/x", size=4, sha256=SHA, kind=CacheKind.VLLM),
        d.DeltaFile(path="inductor/fxgraph/ab/F1/entry", size=5, sha256=SHA, kind=CacheKind.INDUCTOR),
        d.DeltaFile(path="inductor/aotautograd/A1/entry", size=1, sha256=SHA, kind=CacheKind.INDUCTOR),
    )
    delta = _delta(tmp_path, *files).with_base("sha256:" + "c" * 64)
    text = delta.to_json()
    again = d.DeltaManifest.from_json(text)
    assert again == delta and again.to_json() == text
    kinds = json.loads(text)["kinds"]
    assert [kinds[k]["engine_keys"] for k in ("inductor", "triton", "vllm")] == [["A1", "F1"], ["K1"], ["H1"]]
    assert d.engine_key(CacheKind.FLASHINFER, "flashinfer/x/y") is None
    assert delta.total_bytes == 13


@pytest.mark.parametrize(
    ("path", "kind", "why"),
    [
        ("/etc/passwd", CacheKind.TRITON, "not a relative path"),
        ("triton/../x", CacheKind.TRITON, "leaves the cache root"),
        ("inductor/x", CacheKind.TRITON, "not under its kind's directory"),
        ("triton", CacheKind.TRITON, "not under its kind's directory"),
    ],
)
def test_unsafe_paths_are_refused_when_built(tmp_path, path: str, kind: CacheKind, why: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(d.InvalidDelta, match=why):
        _delta(tmp_path, d.DeltaFile(path=path, size=1, sha256=SHA, kind=kind))


def test_bad_json_says_which_file_and_what(tmp_path) -> None:  # type: ignore[no-untyped-def]
    good = json.loads(_delta(tmp_path).to_json())
    cases = [
        ({**good, "schema": 9}, "schema 9"),
        ({**good, "kinds": {"nvcc": {"files": []}}}, "'nvcc' is not a cache kind"),
        ({**good, "base": {"manifest": "md5:x"}}, "base manifest digest"),
        ({**good, "key": "junk"}, "src.json"),
        (
            {**good, "kinds": {"triton": {"files": [{"path": "triton/a/b", "size": 1, "sha256": SHA}] * 2}}},
            "listed twice",
        ),
    ]
    for doc, why in cases:
        with pytest.raises(d.InvalidDelta, match=why):
            d.DeltaManifest.from_json(json.dumps(doc), source="src.json")
    with pytest.raises(d.InvalidDelta, match="not a cache delta"):
        d.DeltaManifest.from_json("[", source="src.json")


def test_a_conflict_is_other_bytes_for_a_baked_path_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = d.DeltaFile(path="triton/K/a", size=1, sha256=SHA, kind=CacheKind.TRITON)
    delta = _delta(tmp_path, f)
    on = d.Layering.of(delta)

    def base(baked: dict[str, str]) -> d.Layering:
        return d.Layering(key=delta.key, manifest=BASE, files=baked)

    assert d.base_problems(on, base({"triton/K/a": SHA, "triton/K/b": SHA}), named="it") == []
    (found,) = d.base_problems(on, base({"triton/K/a": "b" * 64}), named="it")
    assert (
        found
        == f"the delta would replace baked files: triton/K/a: the delta has sha256 {SHA}, the baked file {'b' * 64}"
    )


def test_a_delta_belongs_on_the_base_of_its_image_key_and_bundle_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    delta = _delta(tmp_path).with_base("sha256:" + "c" * 64)
    on = d.Layering.of(delta)
    same = d.Layering(key=delta.key, manifest=BASE, image="sha256:" + "c" * 64)
    assert d.base_problems(on, same, named="the image") == []
    other = d.Layering(
        key=delta.key.replace(model="other/model"),
        manifest="sha256:" + "e" * 64,
        image="sha256:" + "f" * 64,
    )
    found = d.base_problems(on, other, named="the pod's image")
    assert [p.split(",")[0] for p in found] == [
        f"the delta is layered on sha256:{'c' * 64}",
        f"the delta is for key {delta.key.digest}",
        f"the delta is layered on the bundle {BASE}",
    ]
    assert all("the pod's image" in p for p in found)
    # What the checker cannot know is not compared: serve its own image digest, admission
    # the bundle of an image it verified without one.
    unknown = d.Layering(key=delta.key, manifest=None, image=None)
    assert d.base_problems(on, unknown, named="this image") == []
