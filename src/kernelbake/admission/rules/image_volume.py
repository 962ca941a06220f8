"""An image volume that verifies as a kernelbake image (or a GPU index's image variant) is no cache
artifact: nothing here denies it. Its signature and digest are checked (``signature``), so
nothing unsigned runs; what its files are for is the pod's (a kernelbake image's root is no cache
root, so mounted there its caches are not where the engine looks). The webhook admits it, pinned,
with the warning ``UNJUDGED``: where the guarantee ends (docs/image-volumes.md's table). A cache
artifact is judged by ``cache_volume``, a delta by ``delta``, a snapshot by ``snapshot_restore``.
"""

from __future__ import annotations

from kernelbake.admission.pod import ImageVolume
from kernelbake.admission.rules.facts import Facts, Rule
from kernelbake.admission.rules.shape import EMPTY, Verdict
from kernelbake.admission.rules.sites import Resolved

# Said once per such volume: admission judges a container's image against the pod's GPUs, and
# does not judge what an image volume holding a whole image is for.
UNJUDGED = "verified; whether its caches fit the pod's GPUs is not judged for image volumes"


def check(facts: Facts) -> Verdict:
    notes = []
    for g, found in facts.resolved:
        if (
            isinstance(g.site, ImageVolume)
            and isinstance(found, Resolved)
            and found.target in facts.subjects.images
        ):
            notes.append(f"{g.site.where}: {found.text}: {UNJUDGED}")
    return Verdict(notes=tuple(notes)) if notes else EMPTY


RULE = Rule(
    "image-volume",
    "nothing: an image volume holding a whole kernelbake image is admitted, pinned, with a warning that "
    "its fit to the pod's GPUs is not judged",
    check,
)
