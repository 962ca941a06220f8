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

from kernelbake.admission import bounds, gpus, volumes
from kernelbake.admission.bounds import UNBOUNDED, Budget, OverBudget, OverLimit
from kernelbake.admission.gateway import IndexAccepted, Outcome, Rejected, Unavailable, VerifiedLike
from kernelbake.admission.policy import AdmissionPolicy, Mode, OnRegistryError
from kernelbake.admission.references import ImageRef, InvalidReference, alias_names, matches, parse_reference
from kernelbake.admission.review import Code, Operation, Request, Response
from kernelbake.admission.rules import trusted_paths
from kernelbake.admission.rules.caches import CachePlan, decide_caches, opt_in_of, plan_caches
from kernelbake.admission.rules.delta import decide_deltas
from kernelbake.admission.rules.snapshot_restore import VerifiedSnapshotVolume, decide_snapshots
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
from kernelbake.contract.key import CacheKey
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
    # The pod spec and where it is in the object (snapshot restores are judged on it whole).
    spec_path: tuple[str, ...] = ()
    spec: Mapping[str, Any] | None = None

    @property
    def refs(self) -> dict[str, ImageRef]:
        refs = {g.target: g.ref for g in self.governed}
        if self.caches is not None:
            # Governed image volumes are verified as image sites above (same targets); the
            # cache plan adds only what no site names: the opt-in's variant index.
            refs.update(self.caches.opt_in_refs())
        return refs


def plan(request: Request, policy: AdmissionPolicy, budget: Budget = UNBOUNDED) -> Plan:
    if not _reviewed(request):
        return Plan(request, final=_allow(request))
    try:
        return _plan_pod(request, policy, budget)
    except (OverLimit, OverBudget) as exc:
        return _refused(request, policy, f"{request.kind} too large to review: {exc}")
    except MalformedObject as exc:
        return _refused(request, policy, f"malformed {request.kind}: {exc}")


def _allow(request: Request) -> Response:
    return Response(uid=request.uid, api_version=request.api_version, allowed=True)


def _reviewed(request: Request) -> bool:
    """Whether the request can change what runs: a CREATE or UPDATE of the object itself or its
    ephemeral containers."""
    return (
        request.operation in (Operation.CREATE, Operation.UPDATE)
        and request.object is not None
        and request.sub_resource in _CHECKED_SUBRESOURCES
    )


def _refused(request: Request, policy: AdmissionPolicy, problem: str) -> Plan:
    """Denied in every mode: an object too large or malformed to read is never waved through."""
    return Plan(request, final=_problems(request, policy, [problem], (), Code.BAD_REQUEST, always_deny=True))


def _plan_pod(request: Request, policy: AdmissionPolicy, budget: Budget) -> Plan:
    assert request.object is not None  # _reviewed
    found = pod_spec(request.kind, request.object)
    if found is None:
        message = (
            f"kernelbake admission does not review {request.kind} objects (it reviews {known_kinds()}); "
            "check the webhook's rules"
        )
        return Plan(request, final=_problems(request, policy, [message], (), Code.BAD_REQUEST))
    spec_path, spec = found
    old = _old_spec(request)
    if _nothing_changed(request, old, spec):
        # Nothing that runs or where it runs changed (labels, annotations, replicas …):
        # re-checking would only turn a registry outage into failed updates.
        return Plan(request, final=_allow(request))
    old_images = _images(spec_path, old) if old is not None else {}
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
        return Plan(request, final=_allow(request))
    governed, problems, notes = _govern(sites, old_images, policy, budget)
    bounds.cap("the pod's governed images (containers and image volumes)", governed, bounds.MAX_GOVERNED)
    problems += trusted_paths.problems(spec, (g.site for g in governed))
    caches = plan_caches(spec_path, spec, template_metadata(request.object, spec_path), policy)
    if not governed and not problems and caches is None:
        return Plan(request, final=dataclasses.replace(_allow(request), warnings=tuple(notes)))
    found_ways = tuple(ways(spec)) if governed or caches is not None else ()
    return Plan(
        request,
        tuple(governed),
        tuple(problems),
        tuple(notes),
        found_ways,
        caches,
        spec_path=spec_path,
        spec=spec,
    )


def _nothing_changed(request: Request, old: Mapping[str, Any] | None, spec: Mapping[str, Any]) -> bool:
    """An UPDATE that leaves the pod spec and the cache opt-in as they were."""
    return (
        old is not None
        and request.object is not None
        and request.old_object is not None
        and old == spec
        and opt_in_of(request.kind, request.object) == opt_in_of(request.kind, request.old_object)
    )


def _govern(
    sites: Sequence[ImageSite],
    old_images: Mapping[tuple[str, ...], str],
    policy: AdmissionPolicy,
    budget: Budget,
) -> tuple[list[Governed], list[str], list[str]]:
    """The sites whose images the policy governs, and what is wrong (or worth a note) with
    their references before any registry is asked."""
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
        elif ref.tag is None and ref.digest is None:
            problems.append(
                f"{site.where}: image {site.image} has no tag or digest; name the tag kernelbake built "
                "(kernelbake plan shows it) or pin a digest"
            )
        else:
            if ref.tag is not None and ref.digest is not None:
                notes.append(
                    f"{site.where}: image {site.image} names a tag and a digest; the digest wins: it is what "
                    "was verified, and the tag is dropped"
                )
            governed.append(Governed(site, ref, unchanged=old_images.get(site.path) == site.image))
    return governed, problems, notes


def image_sites(spec_path: tuple[str, ...], spec: Mapping[str, Any]) -> Iterator[ImageSite]:
    """Every image the pod pulls: its containers' and its image volumes'."""
    yield from containers(spec_path, spec)
    yield from image_volumes(spec_path, spec)


def _being_deleted(obj: Mapping[str, Any]) -> bool:
    metadata = obj.get("metadata")
    return isinstance(metadata, dict) and bool(metadata.get("deletionTimestamp"))


def _old_spec(request: Request) -> Mapping[str, Any] | None:
    """The pod spec the UPDATE replaces, if it is one and the old object can be read."""
    if request.operation is not Operation.UPDATE or request.old_object is None:
        return None
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
    review = _Review(
        plan,
        outcomes,
        policy,
        # Memoised for this review's ways: hundreds of containers naming one image are judged once.
        judge.for_review(),
        (picker or Picker(judge.catalogue, policy.gpu_match)).for_review(),
        endpoint,
    )
    problems = list(plan.problems)
    notes = list(plan.notes)
    patch: list[dict[str, Any]] = []
    unavailable = 0
    verified: dict[Governed, VerifiedLike] = {}
    for g in plan.governed:
        budget.check()
        verdict = _decide_image(review, g)
        problems += verdict.problems
        notes += verdict.notes
        patch += verdict.patch
        unavailable += verdict.unavailable
        if verdict.verified is not None:
            verified[g] = verdict.verified
    if plan.caches is not None:
        cached = _decide_caches(review, plan.caches, budget, {op["path"] for op in patch})
        problems += cached.problems
        notes += cached.notes
        patch += cached.patch
    restores = _decide_snapshots(review, verified, patch)
    problems += restores.problems
    notes += restores.notes
    patch += restores.patch
    code = Code.UNAVAILABLE if problems and unavailable == len(problems) else Code.FORBIDDEN
    return _problems(plan.request, policy, problems, notes, code, patch=patch)


@dataclasses.dataclass(frozen=True)
class _Review:
    """What ``decide`` judges every governed image with."""

    plan: Plan
    outcomes: Mapping[str, Outcome]
    policy: AdmissionPolicy
    judge: gpus.Judge
    picker: Picker
    endpoint: Endpoint

    def outcome(self, target: str) -> Outcome:
        """The verdict for ``target``; one that did not come in time is unavailable."""
        found = self.outcomes.get(target)
        if found is not None:
            return found
        return Unavailable(
            f"verification did not finish within {self.policy.deadline_seconds:g}s "
            "(is the registry slow or down?)"
        )


@dataclasses.dataclass(frozen=True)
class _Verdict:
    """What one governed image adds to the response."""

    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    patch: tuple[dict[str, Any], ...] = ()
    # Counted so that a denial made only of outages answers "unavailable", not "forbidden".
    unavailable: int = 0
    # What verified (and was judged) for this site: snapshot restores are judged against it.
    verified: VerifiedLike | None = None


@dataclasses.dataclass(frozen=True)
class _Subject:
    """What is judged for a governed image: the image, or the variant of its GPU index that
    the pod runs (verified, judged and pinned as an image from then on)."""

    text: str
    outcome: Outcome
    asked: str | None
    claimed: CacheKey | None = None


def _decide_image(review: _Review, g: Governed) -> _Verdict:
    subject = _Subject(f"{g.site.where}: image {g.site.image}", review.outcome(g.target), g.ref.digest)
    if isinstance(subject.outcome, IndexAccepted):
        picked = _variant_subject(review, g, subject.text, subject.outcome)
        if isinstance(picked, _Verdict):
            return picked
        subject = picked
    outcome = subject.outcome
    if isinstance(outcome, IndexAccepted):
        return _Verdict((f"{subject.text}: the index lists another index, not an image",))
    if isinstance(outcome, Rejected):
        return _Verdict((f"{subject.text} was rejected: {outcome.reason}",))
    if isinstance(outcome, Unavailable):
        if review.policy.registry_errors is OnRegistryError.UNSAFE_ALLOW:
            return _Verdict(
                notes=(
                    f"{subject.text} was admitted UNVERIFIED (registry_errors: unsafe-allow): {outcome.reason}",
                )
            )
        return _Verdict((f"{subject.text} could not be verified: {outcome.reason}",), unavailable=1)
    return _accepted(review, g, subject, outcome.image)


def _variant_subject(
    review: _Review, g: Governed, subject: str, outcome: IndexAccepted
) -> _Subject | _Verdict:
    """The variant of the GPU index that the pod's placement picks, or why none can run."""
    index = outcome.index
    if g.ref.digest is not None and index.digest != g.ref.digest:
        return _Verdict((f"{subject}: verification returned {index.digest}, not the digest asked for",))
    chosen = review.picker(index.variants, review.plan.ways)
    if chosen.variant is None:
        return _Verdict(
            (
                f"{subject} names the GPU index {g.ref.name}@{index.digest}, and "
                f"{'; '.join(chosen.problems)}; {chosen.hint}",
            )
        )
    return _Subject(
        f"{subject} (the {chosen.variant.key.device} variant of its GPU index)",
        review.outcome(variant_target(g.ref, chosen.variant)),
        chosen.variant.digest,
        chosen.variant.key,
    )


def _accepted(review: _Review, g: Governed, subject: _Subject, image: VerifiedLike) -> _Verdict:
    """A verified image: the digest and key it was asked for, judged where the pod runs it, and
    (mutating endpoint) pinned to the digest verified."""
    if subject.asked is not None and image.digest != subject.asked:
        return _Verdict((f"{subject.text}: verification returned {image.digest}, not the digest asked for",))
    if subject.claimed is not None and image.key != subject.claimed:
        return _Verdict(
            (
                f"{subject.text}: the index claims key {subject.claimed.digest} for it, but it verifies as "
                f"{image.key.digest} ({image.key.device}); re-publish and re-sign the index",
            )
        )
    judged = dataclasses.replace(_judge_site(review, g.site, subject.text, image), verified=image)
    pinned = g.ref.rewritten(image.digest)
    if review.endpoint is Endpoint.MUTATE and pinned != g.site.image and not g.unchanged:
        return dataclasses.replace(
            judged, patch=({"op": "replace", "path": g.site.pointer, "value": pinned},)
        )
    return judged


def _judge_site(review: _Review, site: ImageSite, subject: str, image: VerifiedLike) -> _Verdict:
    ways_ = review.plan.ways
    if isinstance(site, ImageVolume):
        if getattr(image, "artifact", None) is not None:
            return _Verdict()  # A cache artifact: what it holds is judged with the pod's caches.
        if isinstance(image, VerifiedSnapshotVolume):
            return _Verdict()  # A snapshot: judged with the containers that restore it.
        found, said = volumes.check(image.key, ways_)
        return _Verdict(tuple(f"{subject}: {p}" for p in found), tuple(f"{subject}: {n}" for n in said))
    verdict = review.judge(image.key, ways_)
    problems = (
        ()
        if verdict.ok
        else (
            f"{subject} was baked for {image.key.device} ({image.key.arch}) but "
            f"{'; '.join(verdict.problems)}; {verdict.hint} ({KEY_FALLBACK})",
        )
    )
    return _Verdict(problems, tuple(f"{subject}: {n} ({KEY_FALLBACK})" for n in verdict.notes))


def _decide_caches(review: _Review, caches: CachePlan, budget: Budget, pinned: set[str]) -> _Verdict:
    """The pod's cache artifacts and the capture deltas layered on its image; a governed image
    volume is pinned with the other images (``pinned``), not twice."""
    cached = decide_caches(
        caches,
        review.outcomes,
        review.plan.ways,
        review.policy,
        review.judge,
        mutate=review.endpoint is Endpoint.MUTATE,
        verified_elsewhere=True,
        budget=budget,
    )
    deltas = decide_deltas(caches, review.outcomes, mutate=review.endpoint is Endpoint.MUTATE)
    return _Verdict(
        (*cached.problems, *deltas.problems),
        (*cached.notes, *deltas.notes),
        tuple(dict(op) for op in (*cached.patch, *deltas.patch) if op["path"] not in pinned),
    )


def _decide_snapshots(
    review: _Review, verified: Mapping[Governed, VerifiedLike], patch: Sequence[Mapping[str, Any]]
) -> _Verdict:
    """Who may have the restore's capabilities (``admission.snapshots``): judged on the pod's
    containers of governed images, against the snapshot volumes and images that verified."""
    plan = review.plan
    if plan.spec is None:
        return _Verdict()
    snapshots = {
        g.site.name: image
        for g, image in verified.items()
        if isinstance(g.site, ImageVolume) and isinstance(image, VerifiedSnapshotVolume)
    }
    images = {g.site.image: image for g, image in verified.items() if not isinstance(g.site, ImageVolume)}
    governed = {g.site.image for g in plan.governed if not isinstance(g.site, ImageVolume)}
    found = decide_snapshots(
        plan.spec,
        snapshots,
        images,
        governed=governed,
        spec_path=plan.spec_path,
        mutate=review.endpoint is Endpoint.MUTATE,
        after=patch,
    )
    return _Verdict(found.problems, found.notes, tuple(dict(op) for op in found.patch))


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
