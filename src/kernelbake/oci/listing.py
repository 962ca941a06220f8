"""Referrers listings, read within bounds whatever their size.

A listing is attacker-shaped: anyone who may push can add referrers (with annotations of any
size) to a digest, and a registry pages the referrers API as it likes. So a listing is read as
the pages a registry links with ``rel="next"`` (same host only), and at most ``MAX_PAGES`` pages
and ``MAX_BYTES`` bytes of them in all; past either bound the reading stops and what was read so
far is used, with ``Listing.cut`` saying which bound stopped it. A page (or the one fallback
index) that runs past the byte bound still gives the entries that lie whole before the cut: the
listing's order is what registries and signers append in, so the bound costs only entries after
``MAX_BYTES`` bytes of others, never the whole listing.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.oci.errors import RegistryProtocolError
from kernelbake.oci.types import Descriptor

# 8 MiB of listing in at most 64 pages: a referrer listed with a kernelbake vouch is ~700 bytes,
# so the bound holds ~12,000 of them, or 140 referrers with 60 KB of annotations each; registries
# page by count, and 64 pages of even 100 entries are more than 8 MiB of small ones.
MAX_PAGES = 64
MAX_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class Listing:
    """The referrers read, in listing order; ``cut``: why reading stopped short, or None."""

    entries: tuple[Descriptor, ...]
    cut: str | None = None
    malformed: int = 0  # entries that are no descriptor (skipped: junk cannot fail the listing)


def bound_text() -> str:
    return f"{MAX_PAGES} pages/{MAX_BYTES >> 20} MiB"


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def index_entries(data: bytes, *, complete: bool, source: str) -> list[Any]:
    """The ``manifests`` entries of an image index as JSON values, in order.

    ``complete``: ``data`` is the whole document, which must parse. Otherwise it was cut off at
    the byte bound: the entries that lie whole before the cut, the rest dropped."""
    if complete:
        return _whole(data, source)
    text = data.decode("utf-8", errors="replace")
    try:
        # raw_decode recurses per level like json.loads: the part read is bounded as a whole.
        jsondoc.refuse_deep(text)
    except jsondoc.TooDeep as exc:
        raise RegistryProtocolError(f"{source}: {exc}") from None
    decoder = json.JSONDecoder()
    out: list[Any] = []
    try:
        i = _ws(text, 0)
        if text[i] != "{":
            raise RegistryProtocolError(f"{source}: not a JSON object")
        i = _ws(text, i + 1)
        while text[i] != "}":
            key, i = decoder.raw_decode(text, i)
            i = _ws(text, i)
            if text[i] != ":":
                return out
            i = _ws(text, i + 1)
            if key == "manifests" and text[i] == "[":
                i = _ws(text, i + 1)
                while text[i] != "]":
                    entry, i = decoder.raw_decode(text, i)
                    out.append(entry)
                    i = _ws(text, i)
                    if text[i] == ",":
                        i = _ws(text, i + 1)
                i += 1
            else:
                _, i = decoder.raw_decode(text, i)
            i = _ws(text, i)
            if text[i] == ",":
                i = _ws(text, i + 1)
    except (ValueError, IndexError):
        pass  # the cut: what lay whole before it is kept
    return out


def _whole(data: bytes, source: str) -> list[Any]:
    try:
        doc = jsondoc.loads(data)
    except jsondoc.TooDeep as exc:
        raise RegistryProtocolError(f"{source}: {exc}") from None
    except ValueError:
        raise RegistryProtocolError(f"{source}: not JSON") from None
    entries = doc.get("manifests") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise RegistryProtocolError(f"{source}: index has no manifests list")
    return entries


def descriptors(entries: list[Any], *, source: str) -> tuple[list[Descriptor], int]:
    """Entries as descriptors, and how many were not descriptors (skipped, not fatal: one
    malformed entry must not hide the others)."""
    out, malformed = [], 0
    for i, entry in enumerate(entries):
        try:
            out.append(Descriptor.from_json(entry, source=f"{source}: manifests[{i}]"))
        except RegistryProtocolError:
            malformed += 1
    return out, malformed
