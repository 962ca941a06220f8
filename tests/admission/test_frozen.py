"""``frozen.fast_init``: the same ``__init__`` as the dataclass's (parameters, defaults, the
instance it makes), still frozen, and refused for a class whose ``__init__`` does more."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from kernelbake.admission import pod, review
from kernelbake.admission.frozen import fast_init


def _twins(**options: Any) -> tuple[type, type]:
    """The same dataclass twice: as dataclasses makes it, and with ``fast_init``."""

    def make() -> type:
        @dataclasses.dataclass(frozen=True, **options)
        class Shape:
            a: int
            d: str  # named like a local of a hand-written __init__
            b: tuple[int, ...] = ()
            c: str = dataclasses.field(default="c", compare=False)
            e: bool = dataclasses.field(default=False, kw_only=True)

        return Shape

    return make(), fast_init(make())


@pytest.mark.parametrize(
    "options", [{}, {"slots": True}, {"kw_only": True}, {"slots": True, "kw_only": True}]
)
def test_it_makes_what_the_dataclass_makes(options: dict[str, Any]) -> None:
    plain, fast = _twins(**options)
    assert fast.__init__ is not plain.__init__
    parameters = list(inspect.signature(plain).parameters.values())
    assert list(inspect.signature(fast).parameters.values()) == parameters
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((), {"a": 1, "d": "x"}),
        ((), {"a": 1, "d": "x", "b": (2,), "c": "y", "e": True}),
    ]
    if not options.get("kw_only"):
        calls += [((1, "x"), {}), ((1, "x", (3,), "z"), {"e": True})]
    for args, kwargs in calls:
        made, want = fast(*args, **kwargs), plain(*args, **kwargs)
        assert [getattr(made, f.name) for f in dataclasses.fields(made)] == [
            getattr(want, f.name) for f in dataclasses.fields(want)
        ]
        assert repr(made).replace("Shape", "") == repr(want).replace("Shape", "")
        assert dataclasses.replace(made, a=2).a == 2
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.a = 3  # type: ignore[attr-defined]
        with pytest.raises(dataclasses.FrozenInstanceError):
            del made.a  # type: ignore[attr-defined]
    for args, kwargs in [
        ((), {}),
        ((1,), {}),
        ((), {"a": 1, "d": "x", "f": 0}),
        ((1, "x", (), "c", True), {}),
    ]:
        with pytest.raises(TypeError) as fast_refusal:
            fast(*args, **kwargs)
        with pytest.raises(TypeError) as plain_refusal:
            plain(*args, **kwargs)
        assert str(fast_refusal.value) == str(plain_refusal.value)


def test_the_webhooks_classes_keep_their_parameters() -> None:
    assert "request" not in inspect.signature(review.Request).parameters
    assert list(inspect.signature(pod.Container).parameters)[:3] == ["field", "index", "name"]
    container = pod.Container("containers", 0, "vllm", "img", ("spec", "containers", "0", "image"), {})
    assert container.mounts == () and container.env == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        container.image = "other"  # type: ignore[misc]


def test_a_class_whose_init_does_more_is_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class After:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True)
    class Outside:
        a: int = dataclasses.field(default=0, init=False)

    @dataclasses.dataclass(frozen=True)
    class Passed:
        a: int
        b: dataclasses.InitVar[int]

    @dataclasses.dataclass
    class Thawed:
        a: int

    for cls in (After, Factory, Outside, Passed, Thawed):
        with pytest.raises(TypeError, match="fast_init"):
            fast_init(cls)
