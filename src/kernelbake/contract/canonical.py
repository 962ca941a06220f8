"""The canonical string of a key dataclass (``CacheKey``, ``SnapshotKey``): ``schema:name=value;…``
in field order, each value its wire string (an Enum's value, anything else ``str``), percent-encoded
but for the characters the key leaves readable; its digest is the sha256 of that string. One
encoding for both keys, so that what makes two keys equal is written once.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from typing import Any, ClassVar
from urllib.parse import quote


class Canonical:
    """``field_order``, ``as_dict``, ``str()`` and ``digest`` of a frozen dataclass key, which sets
    ``PREFIX`` (the schema the string starts with) and ``SAFE`` (the characters left unencoded)."""

    PREFIX: ClassVar[str]
    SAFE: ClassVar[str]
    # Set by @dataclass on the key; declared so that ``dataclasses.fields`` takes the class.
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @classmethod
    def field_order(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def as_dict(self) -> dict[str, str]:
        """Field name → wire string, in canonical order."""
        return {name: _wire(getattr(self, name)) for name in self.field_order()}

    def __str__(self) -> str:
        body = ";".join(f"{k}={quote(v, safe=self.SAFE)}" for k, v in self.as_dict().items())
        return f"{self.PREFIX}:{body}"

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` of the canonical string."""
        return "sha256:" + hashlib.sha256(str(self).encode()).hexdigest()


def _wire(value: Any) -> str:
    return value.value if isinstance(value, enum.Enum) else str(value)
