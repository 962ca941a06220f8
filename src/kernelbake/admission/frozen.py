"""A frozen dataclass's ``__init__`` without the frozen toll: ``fast_init``.

A frozen dataclass's generated ``__init__`` sets each field through ``object.__setattr__``
(its own ``__setattr__`` refuses), looked up and bound anew for every field: under callgrind an
11-field one took 22,800 instructions to make, 11,100 with plain stores. A warm review builds
some 90 such fields (the request, the plan, the pod walked once, the facts every rule reads,
the answer), and they were 5 % of its instructions (876,340 -> 829,585 in process with these).
``fast_init`` gives the class an ``__init__`` with the same parameters and defaults
that stores each field directly: into the instance's ``__dict__``, or through each slot's own
descriptor, bound once, for a class with ``__slots__``. The class stays frozen (``__setattr__``
and ``__delattr__`` still refuse) and nothing else of it changes. A class whose ``__init__``
does more than store its fields (``__post_init__``, an ``InitVar``, a field left out of
``__init__`` or made by a ``default_factory``) is refused when it is defined.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """``cls``, a frozen dataclass, with an ``__init__`` that stores its fields directly."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or not params.init or hasattr(cls, "__post_init__"):
        raise TypeError(
            f"fast_init: {cls.__qualname__} is not a frozen dataclass that only stores its fields"
        )
    shape: Any = cls  # a dataclass, as checked above
    fields = dataclasses.fields(shape)
    if any(not f.init or f.default_factory is not dataclasses.MISSING for f in fields):
        raise TypeError(f"fast_init: {cls.__qualname__} has a field outside __init__ or made by a factory")
    if any(f.name.startswith("__fast") for f in fields):
        raise TypeError(f"fast_init: {cls.__qualname__} names a field like the __init__'s own names")
    slotted = "__slots__" in cls.__dict__
    # The body's own names start "__fast", which no field's does (checked above).
    scope: dict[str, Any] = {}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = [] if slotted else ["    __fast_dict = __fast_self.__dict__"]
    for i, f in enumerate(fields):
        param = f.name
        if f.default is not dataclasses.MISSING:
            scope[f"__fast_default{i}"] = f.default
            param = f"{f.name}=__fast_default{i}"
        (keyword if f.kw_only else positional).append(param)
        if slotted:
            scope[f"__fast_set{i}"] = cls.__dict__[f.name].__set__
            body.append(f"    __fast_set{i}(__fast_self, {f.name})")
        else:
            body.append(f"    __fast_dict[{f.name!r}] = {f.name}")
    signature = ", ".join(["__fast_self", *positional, *(["*", *keyword] if keyword else [])])
    # As dataclasses writes its own: source made from the fields' names, run once per class.
    exec(f"def __init__({signature}):\n" + "\n".join(body or ["    pass"]) + "\n", scope)
    init = scope["__init__"]
    generated = shape.__init__
    init.__qualname__ = generated.__qualname__
    init.__module__ = generated.__module__
    init.__annotations__ = dict(generated.__annotations__)
    # An InitVar, or anything else dataclasses adds, shows as another parameter list.
    if _parameters(init) != _parameters(generated):
        raise TypeError(f"fast_init: {cls.__qualname__}: the stores' parameters differ from the dataclass's")
    type.__setattr__(cls, "__init__", init)
    return cls


def _parameters(init: Any) -> list[inspect.Parameter]:
    """The parameters after ``self`` (named otherwise in the stores' ``__init__``)."""
    return list(inspect.signature(init).parameters.values())[1:]
