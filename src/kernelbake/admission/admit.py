"""The decision, in two pure halves around the gateway's I/O.

``plan`` reads the request: which containers and image volumes name governed images, what is
wrong before any registry is asked (a reference without tag or digest, an unparseable one, an
unlisted registry), or a final answer when there is nothing to check. ``decide`` turns
verification outcomes into the response: signatures, GPU matching for every way the pod can
schedule (containers; an image volume holding a cache artifact is judged by ``cache_volumes``
against the pod's GPUs and engine image, any other by ``volumes.check``), the opt-in's cache
artifact (``cache_volumes``), and in the mutating endpoint a JSONPatch pinning each governed
image to the digest that was verified.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kernelbake.admission import bounds, gpus, trusted_paths, volumes
from kernelbake.admission.bounds import UNBOUNDED, Budget, OverBudget, OverLimit
from kernelbake.admission.cache_volumes import CachePlan, decide_caches, opt_in_of, plan_caches
from kernelbake.admission.deltas import decide_deltas
from kernelbake.admission.gateway import Accepted, IndexAccepted, Outcome, Rejected, Unavailable
from kernelbake.admission.policy import AdmissionPolicy, Mode, OnRegistryError
from kernelbake.admission.references import ImageRef, InvalidReference, alias_names, matches, parse_reference
from kernelbake.admission.review import Code, Operation, Request, Response
from kernelbake.admission.scheduling import Way, ways
from kernelbake.admission.variants import Picker
from kernelbake.admission.volumes import ImageVolume, image_volumes
from kernelbake.admission.workloads import (
    ImageSite,
    MalformedObject,
    containers,
    known_kinds,
    pod_spec,
    template_metadata,
)
from kernelbake.contract.variants import Variant
from kernelbake.oci.reference import REFERENCE_MAX

# Subresources whose object is a Pod that can change what runs; others (status, binding,
# eviction …) cannot change images.
_CHECKED_SUBRESOURCES = ("", "ephemeralcontainers")


# Admission cannot import the engine, so the GPU verdict comes from the image's key (the
# fallback of issue 11's prediction); the pod's `kernelbake serve` asks vLLM itself.
KEY_FALLBACK = "judged from the image's key, the fallback: vLLM's own cache check runs at kernelbake serve"


class Endpoint(enum.Enum):
    MUTATE = "mutate"
    VALIDATE = "validate"


@dataclasses.dataclass(frozen=True)
class Governed:
    site: ImageSite
    ref: ImageRef
    # UPDATE that leaves this image as it was: checked, never rewritten (on a running Pod a new
    # image string restarts the container).
    unchanged: bool = False

    @property
    def target(self) -> str:
        """What is verified: the digest when one is given (it wins over a tag)."""
        return self.ref.target


@dataclasses.dataclass(frozen=True)
class Plan:
    request: Request
    governed: tuple[Governed, ...] = ()
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    ways: tuple[Way, ...] = ()
    # The pod's cache artifacts (``cache_volumes``): the opt-in annotation, and what governed
    # image volumes hold, judged against the pod's GPUs and engine image.
    caches: CachePlan | None = None
    # Set when the answer needs no verification.
    final: Response | None = None

    @property
    def refs(self) -> dict[str, ImageRef]:
        refs = {g.target: g.ref for g in self.governed}
        if self.caches is not None:
            # Governed image volumes are verified as image sites above (same targets); the
            # cache plan adds only what no site names: the opt-in's variant index.
            refs.update(self.caches.opt_in_refs())
        return refs


def plan(request: Request, policy: AdmissionPolicy, budget: Budget = UNBOUNDED) -> Plan:
    allow = Response(uid=request.uid, api_version=request.api_version, allowed=True)
    if request.operation not in (Operation.CREATE, Operation.UPDATE) or request.object is None:
        return Plan(request, final=allow)
    if request.sub_resource not in _CHECKED_SUBRESOURCES:
        return Plan(request, final=allow)
    try:
        found = pod_spec(request.kind, request.object)
        if found is None:
            message = (
                f"kernelbake admission does not review {request.kind} objects (it reviews {known_kinds()}); "
                "check the webhook's rules"
            )
            return Plan(request, final=_problems(request, policy, [message], (), Code.BAD_REQUEST))
        spec_path, spec = found
        old_images: dict[tuple[str, ...], str] = {}
        if request.operation is Operation.UPDATE and request.old_object is not None:
            old = _old_spec(request)
            if old == spec and opt_in_of(request.kind, request.object) == opt_in_of(
                request.kind, request.old_object
            ):
                # Nothing that runs or where it runs changed (labels, annotations, replicas …):
                # re-checking would only turn a registry outage into failed updates.
                return Plan(request, final=allow)
            if old is not None:
                old_images = _images(spec_path, old)
        sites = list(image_sites(spec_path, spec))
        if (
            request.operation is Operation.UPDATE
            and _being_deleted(request.object)
            and all(old_images.get(s.path) == s.image for s in sites)
        ):
            # Being deleted, and every image was already there: denying now would only block
            # finalizers and garbage collection. Never on CREATE: the API server clears a
            # deletionTimestamp sent with a new object only after mutating admission, so it
            # would wave an unreviewed image through.
            return Plan(request, final=allow)
        registries = policy.listed_registries()
        governed: list[Governed] = []
        problems: list[str] = []
        notes: list[str] = []
        for site in sites:
            budget.check()
            ref = _classify(site.image, policy.images, registries)
            if ref is None:
                continue
            if isinstance(ref, str):
                problems.append(f"{site.where}: {ref}")
                continue
            if ref.tag is None and ref.digest is None:
                problems.append(
                    f"{site.where}: image {site.image} has no tag or digest; name the tag kernelbake built "
                    "(kernelbake plan shows it) or pin a digest"
                )
                continue
            if ref.tag is not None and ref.digest is not None:
                notes.append(
                    f"{site.where}: image {site.image} names a tag and a digest; the digest wins: it is what "
                    "was verified, and the tag is dropped"
                )
            governed.append(Governed(site, ref, unchanged=old_images.get(site.path) == site.image))
        bounds.cap("the pod's governed images (containers and image volumes)", governed, bounds.MAX_GOVERNED)
        problems += trusted_paths.problems(spec, (g.site for g in governed))
        caches = plan_caches(spec_path, spec, template_metadata(request.object, spec_path), policy)
        found_ways = tuple(ways(spec)) if governed or caches is not None else ()
    except (OverLimit, OverBudget) as exc:
        return Plan(
            request,
            final=_problems(
                request,
                policy,
                [f"{request.kind} too large to review: {exc}"],
                (),
                Code.BAD_REQUEST,
                always_deny=True,
            ),
        )
    except MalformedObject as exc:
        return Plan(
            request,
            final=_problems(
                request, policy, [f"malformed {request.kind}: {exc}"], (), Code.BAD_REQUEST, always_deny=True
            ),
        )
    if not governed and not problems and caches is None:
        return Plan(request, final=dataclasses.replace(allow, warnings=tuple(notes)))
    return Plan(request, tuple(governed), tuple(problems), tuple(notes), found_ways, caches)


def image_sites(spec_path: tuple[str, ...], spec: Mapping[str, Any]) -> Iterator[ImageSite]:
    """Every image the pod pulls: its containers' and its image volumes'."""
    yield from containers(spec_path, spec)
    yield from image_volumes(spec_path, spec)


def _being_deleted(obj: Mapping[str, Any]) -> bool:
    metadata = obj.get("metadata")
    return isinstance(metadata, dict) and bool(metadata.get("deletionTimestamp"))


def _old_spec(request: Request) -> Mapping[str, Any] | None:
    assert request.old_object is not None
    try:
        found = pod_spec(request.kind, request.old_object)
    except MalformedObject:
        return None
    return found[1] if found else None


def _images(spec_path: tuple[str, ...], spec: Mapping[str, Any]) -> dict[tuple[str, ...], str]:
    try:
        return {s.path: s.image for s in image_sites(spec_path, spec)}
    except MalformedObject:
        return {}


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
    else None (ungoverned). Fails closed: a reference the runtime might read differently from
    us is never waved through. Memoised: a cluster runs few images."""
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


def decide(
    plan: Plan,
    outcomes: Mapping[str, Outcome],
    policy: AdmissionPolicy,
    judge: gpus.Judge,
    endpoint: Endpoint,
    picker: Picker | None = None,
    budget: Budget = UNBOUNDED,
) -> Response:
    if plan.final is not None:
        return plan.final
    # Memoised for this review's ways: hundreds of containers naming one image are judged once.
    judge = judge.for_review()
    picker = (picker or Picker(judge.catalogue, policy.gpu_match)).for_review()
    problems = list(plan.problems)
    notes = list(plan.notes)
    patch: list[dict[str, Any]] = []
    unavailable = 0
    late = Unavailable(
        f"verification did not finish within {policy.deadline_seconds:g}s (is the registry slow or down?)"
    )
    for g in plan.governed:
        budget.check()
        outcome = outcomes.get(g.target) or late
        subject = f"{g.site.where}: image {g.site.image}"
        asked = g.ref.digest
        claimed = None
        if isinstance(outcome, IndexAccepted):
            index = outcome.index
            if asked is not None and index.digest != asked:
                problems.append(f"{subject}: verification returned {index.digest}, not the digest asked for")
                continue
            chosen = picker(index.variants, plan.ways)
            if chosen.variant is None:
                problems.append(
                    f"{subject} names the GPU index {g.ref.name}@{index.digest}, and "
                    f"{'; '.join(chosen.problems)}; {chosen.hint}"
                )
                continue
            # From here on the pod runs the variant: it is verified, judged and pinned as an image.
            subject = f"{subject} (the {chosen.variant.key.device} variant of its GPU index)"
            asked, claimed = chosen.variant.digest, chosen.variant.key
            outcome = outcomes.get(variant_target(g.ref, chosen.variant)) or late
        if isinstance(outcome, IndexAccepted):
            problems.append(f"{subject}: the index lists another index, not an image")
        elif isinstance(outcome, Rejected):
            problems.append(f"{subject} was rejected: {outcome.reason}")
        elif isinstance(outcome, Unavailable):
            if policy.registry_errors is OnRegistryError.UNSAFE_ALLOW:
                notes.append(
                    f"{subject} was admitted UNVERIFIED (registry_errors: unsafe-allow): {outcome.reason}"
                )
            else:
                unavailable += 1
                problems.append(f"{subject} could not be verified: {outcome.reason}")
        elif isinstance(outcome, Accepted):
            image = outcome.image
            if asked is not None and image.digest != asked:
                problems.append(f"{subject}: verification returned {image.digest}, not the digest asked for")
                continue
            if claimed is not None and image.key != claimed:
                problems.append(
                    f"{subject}: the index claims key {claimed.digest} for it, but it verifies as "
                    f"{image.key.digest} ({image.key.device}); re-publish and re-sign the index"
                )
                continue
            if isinstance(g.site, ImageVolume) and getattr(image, "artifact", None) is not None:
                pass  # A cache artifact: what it holds is judged with the pod's caches, below.
            elif isinstance(g.site, ImageVolume):
                found, said = volumes.check(image.key, plan.ways)
                problems += [f"{subject}: {p}" for p in found]
                notes += [f"{subject}: {n}" for n in said]
            else:
                verdict = judge(image.key, plan.ways)
                if not verdict.ok:
                    problems.append(
                        f"{subject} was baked for {image.key.device} ({image.key.arch}) but "
                        f"{'; '.join(verdict.problems)}; {verdict.hint} ({KEY_FALLBACK})"
                    )
                notes += [f"{subject}: {n} ({KEY_FALLBACK})" for n in verdict.notes]
            pinned = g.ref.rewritten(image.digest)
            if endpoint is Endpoint.MUTATE and pinned != g.site.image and not g.unchanged:
                patch.append({"op": "replace", "path": g.site.pointer, "value": pinned})
    if plan.caches is not None:
        cached = decide_caches(
            plan.caches,
            outcomes,
            plan.ways,
            policy,
            judge,
            mutate=endpoint is Endpoint.MUTATE,
            verified_elsewhere=True,
            budget=budget,
        )
        pinned_deltas = decide_deltas(plan.caches, outcomes, mutate=endpoint is Endpoint.MUTATE)
        problems += cached.problems + pinned_deltas.problems
        notes += cached.notes + pinned_deltas.notes
        # A governed image volume is pinned above, with the other images; not twice.
        pinned_here = {op["path"] for op in patch}
        patch += [dict(op) for op in (*cached.patch, *pinned_deltas.patch) if op["path"] not in pinned_here]
    code = Code.UNAVAILABLE if problems and unavailable == len(problems) else Code.FORBIDDEN
    return _problems(plan.request, policy, problems, notes, code, patch=patch)


def variant_target(ref: ImageRef, variant: Variant) -> str:
    """What is verified for the variant of ``ref``'s index that a pod runs."""
    return f"{ref.name}@{variant.digest}"


def variant_refs(plan: Plan, outcomes: Mapping[str, Outcome], picker: Picker) -> dict[str, ImageRef]:
    """The variants to verify next: for each governed image whose verdict is a GPU index, the
    variant its pod's placement picks (``decide`` picks the same)."""
    refs: dict[str, ImageRef] = {}
    picker = picker.for_review()
    for g in plan.governed:
        outcome = outcomes.get(g.target)
        if isinstance(outcome, IndexAccepted):
            chosen = picker(outcome.index.variants, plan.ways)
            if chosen.variant is not None:
                target = variant_target(g.ref, chosen.variant)
                refs[target] = parse_reference(target)
    return refs


def _problems(
    request: Request,
    policy: AdmissionPolicy,
    problems: Sequence[str],
    notes: Sequence[str],
    code: Code,
    *,
    patch: Sequence[Mapping[str, Any]] = (),
    always_deny: bool = False,
) -> Response:
    """Allowed (with the patch) without problems or in warn mode, else denied with all of them,
    one per cause, in a message of a few KiB (``bounds.message``) however many there are."""
    uid, version = request.uid, request.api_version
    if not problems:
        return Response(
            uid=uid, api_version=version, allowed=True, warnings=bounds.warnings(notes), patch=tuple(patch)
        )
    if policy.mode is Mode.WARN and not always_deny:
        warned = [f"kernelbake (warn mode) would deny: {p}" for p in problems]
        return Response(
            uid=uid,
            api_version=version,
            allowed=True,
            warnings=bounds.warnings([*warned, *notes]),
            patch=tuple(patch),
        )
    message = "kernelbake admission: " + bounds.message(problems)
    return Response(
        uid=uid,
        api_version=version,
        allowed=False,
        code=code,
        message=message,
        warnings=bounds.warnings(notes),
    )
