"""A CRIU ``-v4`` log read for where its time went: the longest waits between two stamped lines,
and the time split by the work a wait follows. Standard library only (it runs on the device's
bare python and inside containers that do not have kernelbake); bench/snapshot_flow.py and
bench/criu_validation_probe.py read each restore's log with it."""

from __future__ import annotations

import itertools
import re
from typing import Any

# A line of CRIU's -v3/-v4 log: ``(SS.ffffff) text``, seconds from CRIU's start.
_CRIU_STAMP = re.compile(r"^\((\d+\.\d+)\)\s?(.*)$")


def _stamped(log: str) -> list[tuple[float, str]]:
    """The log's stamped lines as (seconds, text); lines without a stamp are passed over."""
    return [(float(m[1]), m[2]) for line in log.splitlines() if (m := _CRIU_STAMP.match(line))]


def criu_waits(log: str, most: int = 8) -> list[list[Any]]:
    """The ``most`` longest gaps between two stamped lines of a CRIU log, longest first:
    ``[seconds, the line before the gap, the line after it]``. Where a restore with the page
    cache dropped takes 13.73 s against 1.86 s warm (the MoE, H100, 2026-12-07), the gaps say
    what CRIU waited for."""
    stamped = _stamped(log)
    gaps = [
        [round(after[0] - before[0], 3), before[1][:200], after[1][:200]]
        for before, after in itertools.pairwise(stamped)
    ]
    return sorted(gaps, key=lambda g: -g[0])[:most]


# What a CRIU restore's time goes to, by the line a wait follows (the operation under way):
# with the page cache dropped the 8B beside spent 6 of its 9.61 s in the opening of 3,715 file
# mappings (H100, 2026-12-07), found by reading the log; the flow now says it itself.
_CRIU_WORK = (
    ("opening file mappings", re.compile(r"Opening 0x[0-9a-f]+-0x[0-9a-f]+ .*\bvma$")),
    ("reading pages", re.compile(r"\bPreadv\b")),
)


def criu_time_by_work(log: str) -> dict[str, dict[str, Any]]:
    """A CRIU log's time split by what each gap between two stamped lines follows (`_CRIU_WORK`,
    else ``other``): per kind the lines, the seconds waited after them, the first and last
    stamp. The restored processes' lines interleave, so a wait is counted once, for the line
    just before it; the kinds' seconds add up to the log's span."""
    stamped = _stamped(log)
    out: dict[str, dict[str, Any]] = {}
    for i, (at, text) in enumerate(stamped):
        kind = next((name for name, pattern in _CRIU_WORK if pattern.search(text)), "other")
        row = out.setdefault(kind, {"lines": 0, "waited_s": 0.0, "first_s": at, "last_s": at})
        row["lines"] += 1
        row["last_s"] = at
        if i + 1 < len(stamped):
            row["waited_s"] += stamped[i + 1][0] - at
    for row in out.values():
        row["waited_s"] = round(row["waited_s"], 3)
    return out
