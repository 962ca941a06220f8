"""What each governed image of the pod verified as: the reference followed through a GPU index to
the variant the pod's placement picks, and checked to be what was asked for (digest, claimed
key). The rules read the result (``Resolved``, or why not: ``Unresolved``); ``service`` asks
for the variants to verify next (``variant_refs``), picked as here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from kernelbake.admission.frozen import fast_init
from kernelbake.admission.pod import Container, ImageVolume
from kernelbake.admission.references import ImageRef, parse_reference
from kernelbake.admission.scheduling import Way
from kernelbake.admission.subject import IndexAccepted, Outcome, Rejected, Subject, Unavailable
from kernelbake.admission.variants import Picker
from kernelbake.contract.variants import Variant

Site = Container | ImageVolume


@fast_init
@dataclasses.dataclass(frozen=True)
class Governed:
    """An image site whose reference the policy governs."""

    site: Site
    ref: ImageRef
    # UPDATE that leaves this image as it was: checked, never rewritten (on a running Pod a new
    # image string restarts the container).
    unchanged: bool = False

    @property
    def target(self) -> str:
        """What is verified: the digest when one is given (it wins over a tag)."""
        return self.ref.target


@fast_init
@dataclasses.dataclass(frozen=True)
class Resolved:
    """The site verified: ``subject`` is what ``target`` verified as."""

    # How the answer names it after the site: "image R", or the variant of R's GPU index.
    text: str
    target: str
    subject: Subject


@fast_init
@dataclasses.dataclass(frozen=True)
class Unresolved:
    """Why the site did not verify: ``message`` (after the site), with ``hint``."""

    text: str
    message: str
    hint: str = ""
    # The registry could not be asked, and why (``registry_errors`` decides).
    outage: str | None = None


Resolution = Resolved | Unresolved


def resolve(
    g: Governed, outcomes: Mapping[str, Outcome], picker: Picker, ways: Sequence[Way], deadline: float
) -> Resolution:
    text, target, asked, claimed = f"image {g.site.image}", g.target, g.ref.digest, None
    outcome = _outcome(outcomes, target, deadline)
    if isinstance(outcome, IndexAccepted):
        index = outcome.index
        if g.ref.digest is not None and index.digest != g.ref.digest:
            return Unresolved(text, f"{text}: verification returned {index.digest}, not the digest asked for")
        chosen = picker(index.variants, ways)
        if chosen.variant is None:
            return Unresolved(
                text,
                f"{text} names the GPU index {g.ref.name}@{index.digest}, and {'; '.join(chosen.problems)}",
                chosen.hint,
            )
        text = f"{text} (the {chosen.variant.key.device} variant of its GPU index)"
        target, asked, claimed = (
            variant_target(g.ref, chosen.variant),
            chosen.variant.digest,
            chosen.variant.key,
        )
        outcome = _outcome(outcomes, target, deadline)
    if isinstance(outcome, IndexAccepted):
        return Unresolved(text, f"{text}: the index lists another index, not an image")
    if isinstance(outcome, Rejected):
        return Unresolved(text, f"{text} was rejected: {outcome.reason}")
    if isinstance(outcome, Unavailable):
        return Unresolved(text, f"{text} could not be verified: {outcome.reason}", outage=outcome.reason)
    subject = outcome.subject
    if asked is not None and subject.digest != asked:
        return Unresolved(text, f"{text}: verification returned {subject.digest}, not the digest asked for")
    if claimed is not None and subject.key != claimed:
        return Unresolved(
            text,
            f"{text}: the index claims key {claimed.digest} for it, but it verifies as "
            f"{subject.key.digest} ({subject.key.device})",
            "re-publish and re-sign the index",
        )
    return Resolved(text, target, subject)


def _outcome(outcomes: Mapping[str, Outcome], target: str, deadline: float) -> Outcome:
    """The verdict for ``target``; one that did not come in time is unavailable."""
    found = outcomes.get(target)
    if found is not None:
        return found
    return Unavailable(f"verification did not finish within {deadline:g}s (is the registry slow or down?)")


def variant_target(ref: ImageRef, variant: Variant) -> str:
    """What is verified for the variant of ``ref``'s index that a pod runs."""
    return f"{ref.name}@{variant.digest}"


def variant_refs(
    governed: Sequence[Governed], outcomes: Mapping[str, Outcome], picker: Picker, ways: Sequence[Way]
) -> dict[str, ImageRef]:
    """The variants to verify next: for each governed image whose verdict is a GPU index, the
    variant its pod's placement picks (``resolve`` picks the same)."""
    refs: dict[str, ImageRef] = {}
    picker = picker.for_review()
    for g in governed:
        outcome = outcomes.get(g.target)
        if isinstance(outcome, IndexAccepted):
            chosen = picker(outcome.index.variants, ways)
            if chosen.variant is not None:
                target = variant_target(g.ref, chosen.variant)
                refs[target] = parse_reference(target)
    return refs
