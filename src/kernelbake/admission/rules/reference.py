"""A governed image must be named so that what is verified is what the runtime pulls: a reference
kernelbake can read, with a tag or a sha256 digest, written with the registry host the policy
names, and (``unlisted_registries: deny``) from a registry the policy lists.

Found while planning (``govern``: which sites the policy governs is this same reading), before
any registry is asked; ``check`` reports it. Fails closed: a reference the runtime might read
differently from us is never waved through. Memoised: a cluster runs few images.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

from kernelbake.admission.bounds import Budget
from kernelbake.admission.frozen import fast_init
from kernelbake.admission.policy import AdmissionPolicy
from kernelbake.admission.references import ImageRef, InvalidReference, alias_names, matches, parse_reference
from kernelbake.admission.rules.facts import Facts, Rule
from kernelbake.admission.rules.shape import Denial, Verdict, verdict
from kernelbake.admission.rules.sites import Governed, Site
from kernelbake.oci.reference import REFERENCE_MAX


@fast_init
@dataclasses.dataclass(frozen=True)
class Governing:
    governed: tuple[Governed, ...]
    found: Verdict


def govern(
    sites: Sequence[Site], old_images: Mapping[tuple[str, ...], str], policy: AdmissionPolicy, budget: Budget
) -> Governing:
    """The sites whose images the policy governs, and what is wrong (or worth a note) with
    their references before any registry is asked."""
    registries = policy.listed_registries()
    governed: list[Governed] = []
    denials: list[Denial] = []
    notes: list[str] = []
    for site in sites:
        budget.check()
        ref = _classify(site.image, policy.images, registries)
        if ref is None:
            continue
        if isinstance(ref, str):
            denials.append(Denial(site.where, ref))
        elif ref.tag is None and ref.digest is None:
            denials.append(
                Denial(
                    site.where,
                    f"image {site.image} has no tag or digest",
                    "name the tag kernelbake built (kernelbake plan shows it) or pin a digest",
                )
            )
        else:
            if ref.tag is not None and ref.digest is not None:
                notes.append(
                    f"{site.where}: image {site.image} names a tag and a digest; the digest wins: it is what "
                    "was verified, and the tag is dropped"
                )
            governed.append(Governed(site, ref, unchanged=old_images.get(site.path) == site.image))
    return Governing(tuple(governed), verdict(denials, notes))


def check(facts: Facts) -> Verdict:
    return facts.planned.references


RULE = Rule(
    "reference",
    "a governed image whose reference cannot be read, has neither tag nor digest, pins a digest that "
    "is not sha256, may name a governed repository through another spelling of its registry host, or "
    "(`unlisted_registries: deny`) comes from a registry the policy does not list",
    check,
)


def _classify(
    image: str, patterns: tuple[str, ...], registries: tuple[str, ...] | None
) -> ImageRef | str | None:
    # Memoised for references that can be valid: the memo keeps its keys, and a pod author's
    # megabyte of image string (unreadable anyway) must not outlive the review.
    if len(image) > REFERENCE_MAX:
        return _classify_uncached(image, patterns, registries)
    return _classify_memo(image, patterns, registries)


def _classify_uncached(
    image: str, patterns: tuple[str, ...], registries: tuple[str, ...] | None
) -> ImageRef | str | None:
    """The parsed reference if ``patterns`` govern it; a problem when it cannot be
    canonicalised, may name a governed repository through another spelling of its host, or
    (``registries`` given: ``unlisted_registries: deny``) comes from a registry not listed;
    else None (ungoverned)."""
    try:
        ref = parse_reference(image)
    except InvalidReference as exc:
        return f"{exc}; kernelbake admission admits only references it can read"
    if any(matches(ref.name, p) for p in patterns):
        if ref.digest is not None and not ref.digest.startswith("sha256:"):
            return f"image {image!r}: kernelbake verifies sha256 digests only; pin the sha256 digest"
        return ref
    for alias in alias_names(ref):
        if any(matches(alias, p) for p in patterns):
            return (
                f"image {image!r} may name the governed repository {alias} through another spelling "
                f"of its registry host; write it as {alias}"
            )
    if registries is not None and not any(matches(ref.domain, r) for r in registries):
        # The one answer to a name that reaches a governed registry in a way no name check can
        # see (an /etc/hosts or DNS alias): only registries the policy names are pulled from.
        return (
            f"image {image!r} is from the registry {ref.domain}, which the policy does not list "
            "(unlisted_registries: deny); govern it under images, or list it in unverified_registries"
        )
    return None


_classify_memo = functools.lru_cache(maxsize=4096)(_classify_uncached)
