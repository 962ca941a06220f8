"""The mounts at a directory ``serve`` trusts as one verified volume's own (the delta root, the
snapshot root): the delta and snapshot rules both allow only that volume there, whole. Anything
else mounted at or inside the root would put files there that ``serve`` reads as verified.
"""

from __future__ import annotations

from collections.abc import Collection

from kernelbake.admission.pod import Container, Mount
from kernelbake.admission.rules.shape import Denial


def root_mounts(
    c: Container, verified: Collection[str], root: str, *, what: str, use: str
) -> tuple[list[Mount], list[Denial]]:
    """The container's mounts of ``verified`` volumes (by name), and a denial for each other
    mount at or inside ``root`` and each verified one mounted in part. ``what`` names the kind
    ("cache delta"), ``use`` what ``serve`` does at the root ("restores a snapshot from")."""
    # One pass over the mounts (denials in the order the two kinds were always listed: the
    # strangers at or inside the root, then the verified volumes mounted in part).
    ours: list[Mount] = []
    strangers: list[Mount] = []
    for m in c.mounts:
        if m.name in verified:
            ours.append(m)
        elif m.under(root):
            strangers.append(m)
    if not strangers and not ours:
        return ours, []
    problems = [
        Denial(
            c.where,
            f"volume {str(m.name)[:80]!r} is mounted at {str(m.path)[:80]!r}, where serve {use}; "
            f"only a verified {what}'s image volume belongs there, whole",
        )
        for m in strangers
    ]
    problems += [
        Denial(
            c.where, f"{what} {str(m.name)[:80]!r} is mounted in part (subPath)", f"mount it at {root} whole"
        )
        for m in ours
        if m.partial
    ]
    return ours, problems
