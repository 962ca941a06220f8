from __future__ import annotations

import pytest
from hypothesis import given

from kernelbake.contract.compat import Severity, check, check_fields
from kernelbake.contract.key import NONE, CacheKey, InvalidKey, key_from_labels, parse_key
from kernelbake.plan import plan
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.support.fake_engine import platform_for
from tests.support.strategies import keys


@given(keys())
def test_canonical_string_round_trips(key: CacheKey) -> None:
    assert parse_key(str(key)) == key
    assert str(parse_key(str(key))) == str(key)


@given(keys())
def test_labels_round_trip(key: CacheKey) -> None:
    assert key_from_labels(key.labels()) == key


@given(keys())
def test_tag_is_a_valid_oci_tag(key: CacheKey) -> None:
    import re

    tag = key.tag("h100")
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag), tag
    assert key.short_digest[:8] in tag or len(tag) == 128


def _qwen_h100() -> CacheKey:
    return plan(load_spec(REPO / "images/qwen3-8b.yaml"), ["h100"])[0].key


def test_edited_label_is_caught() -> None:
    labels = _qwen_h100().labels()
    labels["dev.kernelbake.device"] = "NVIDIA H100 PCIe"
    with pytest.raises(InvalidKey, match="device"):
        key_from_labels(labels)


def test_bad_strings_quote_the_input() -> None:
    with pytest.raises(InvalidKey, match="'nope'"):
        parse_key("nope")
    good = str(_qwen_h100())
    with pytest.raises(InvalidKey, match="missing fields"):
        parse_key(good.replace(";tp=1", ""))
    with pytest.raises(InvalidKey, match="not an integer"):
        parse_key(good.replace(";tp=1", ";tp=x"))


def test_check_gives_reasons_and_driver_is_a_floor() -> None:
    baked = _qwen_h100()
    assert check(baked, platform_for(baked, driver="590.10.01")).reasons == ()
    old = check(baked, platform_for(baked, driver="550.1"))
    assert [r.field for r in old.blocking] == ["driver_floor"]
    assert str(old.blocking[0]) == (
        f"driver_floor: baked {baked.driver_floor!r}, found '550.1' "
        f"(the image's CUDA needs driver ≥ {baked.driver_floor})"
    )
    pcie = check(baked, platform_for(baked, device="NVIDIA H100 PCIe", driver="590.1"))
    assert [r.field for r in pcie.reasons] == ["device"]
    assert pcie.reasons[0].severity is Severity.BLOCKING
    assert "device name" in str(pcie.reasons[0])
    several = check(baked, platform_for(baked, python="3.13", torch="2.12.0", driver=NONE))
    assert [r.field for r in several.reasons] == ["torch", "python", "driver_floor"]


def test_check_fields_judges_only_what_is_given() -> None:
    baked = _qwen_h100()
    assert check_fields(baked, {"device": baked.device}).reasons == ()
    assert [r.field for r in check_fields(baked, {"arch": "sm_80"}).reasons] == ["arch"]
    with pytest.raises(ValueError, match="driver_floor"):
        check_fields(baked, {"driver_floor": "1.0"})
