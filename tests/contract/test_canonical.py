"""The canonical string both keys share (``contract.canonical``): fields in order, wire strings,
percent-encoded but for the key's readable characters, and the sha256 of that string."""

from __future__ import annotations

import dataclasses
import enum
import hashlib

from kernelbake.contract.canonical import Canonical


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Toy(Canonical):
    PREFIX = "t1"
    SAFE = "-"

    colour: Colour
    count: int
    text: str


def test_a_key_is_its_fields_in_order_as_wire_strings_and_their_digest() -> None:
    toy = Toy(colour=Colour.RED, count=3, text="a;b=c-d /")
    assert Toy.field_order() == ("colour", "count", "text")
    assert toy.as_dict() == {"colour": "red", "count": "3", "text": "a;b=c-d /"}
    # ';' and '=' separate parts, so they are always encoded; '-' is in SAFE, '/' is not here.
    text = "t1:colour=red;count=3;text=a%3Bb%3Dc-d%20%2F"
    assert str(toy) == text
    assert toy.digest == "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_the_prefix_and_safe_characters_are_no_fields() -> None:
    assert [f.name for f in dataclasses.fields(Toy)] == ["colour", "count", "text"]
