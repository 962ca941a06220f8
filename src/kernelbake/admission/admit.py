"""The decision, in two pure halves around the gateway's I/O.

``plan`` reads the request: it walks the pod spec once (``pod.walk``), finds which containers
and image volumes name governed images (``rules.reference.govern``), what the rules that read the
pod spec alone find (``rules.trusted_paths.find``), what the pod's caches need (``rules.caches``)
and where it can run (``scheduling.ways``); or it answers at once when there is nothing to check,
or when the object cannot be reviewed (malformed, too large, a kind admission does not review:
denied with code 400). ``decide`` turns the verification outcomes into the
answer: every rule of ``rules.RULES`` on the same facts, and in the mutating endpoint the
JSONPatch they make (each governed image pinned to the digest that verified).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from kernelbake.admission import bounds
from kernelbake.admission.bounds import UNBOUNDED, Budget, OverBudget, OverLimit
from kernelbake.admission.frozen import fast_init
from kernelbake.admission.gpus import Judge
from kernelbake.admission.pod import Pod, walk
from kernelbake.admission.policy import AdmissionPolicy, Mode
from kernelbake.admission.references import ImageRef
from kernelbake.admission.review import Code, Operation, Request, Response
from kernelbake.admission.rules import judge as run_rules
from kernelbake.admission.rules import trusted_paths
from kernelbake.admission.rules.caches import CachePlan, opt_in_of, plan_caches
from kernelbake.admission.rules.facts import NOTHING_PLANNED, Facts, Planned
from kernelbake.admission.rules.reference import govern
from kernelbake.admission.rules.shape import Denial
from kernelbake.admission.rules.sites import Governed
from kernelbake.admission.scheduling import Way, ways
from kernelbake.admission.subject import Outcome
from kernelbake.admission.variants import Picker
from kernelbake.admission.workloads import MalformedObject, known_kinds, pod_spec, template_metadata

# Subresources whose object is a Pod that can change what runs; others (status, binding,
# eviction …) cannot change images.
_CHECKED_SUBRESOURCES = ("", "ephemeralcontainers")


class Endpoint(enum.Enum):
    """The webhook's two paths; only the mutating one's answer carries the patch (pins, caches)."""

    MUTATE = "mutate"
    VALIDATE = "validate"


@fast_init
@dataclasses.dataclass(frozen=True)
class Plan:
    """A request read before any registry is asked: what to verify, or the answer if none is needed."""

    request: Request
    pod: Pod | None = None
    governed: tuple[Governed, ...] = ()
    # What the rules that read the pod spec alone found, before any registry is asked.
    planned: Planned = NOTHING_PLANNED
    ways: tuple[Way, ...] = ()
    # The pod's cache artifacts: the opt-in annotation, and the governed image volumes.
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
    final = _answer(request, policy, [Denial("", problem)], (), always_deny=True, code=Code.BAD_REQUEST)
    return Plan(request, final=final)


def _plan_pod(request: Request, policy: AdmissionPolicy, budget: Budget) -> Plan:
    assert request.object is not None  # _reviewed
    found = pod_spec(request.kind, request.object)
    if found is None:
        message = (
            f"kernelbake admission does not review {request.kind} objects (it reviews {known_kinds()}); "
            "check the webhook's rules"
        )
        return Plan(request, final=_answer(request, policy, [Denial("", message)], (), code=Code.BAD_REQUEST))
    spec_path, spec = found
    old = _old_spec(request)
    if _nothing_changed(request, old, spec):
        # Nothing that runs or where it runs changed (labels, annotations, replicas …):
        # re-checking would only turn a registry outage into failed updates.
        return Plan(request, final=_allow(request))
    old_images = _images(spec_path, old) if old is not None else {}
    pod = walk(spec_path, spec)
    sites = list(pod.sites())
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
    governing = govern(sites, old_images, policy, budget)
    governed = governing.governed
    bounds.cap("the pod's governed images (containers and image volumes)", governed, bounds.MAX_GOVERNED)
    planned = Planned(governing.found, trusted_paths.find([g.site for g in governed]))
    caches = plan_caches(pod, template_metadata(request.object, spec_path), policy)
    if not governed and not governing.found.denials and caches is None:
        return Plan(
            request, final=dataclasses.replace(_allow(request), warnings=tuple(governing.found.notes))
        )
    found_ways = tuple(ways(spec)) if governed or caches is not None else ()
    return Plan(request, pod, governed, planned, found_ways, caches)


def _nothing_changed(request: Request, old: Mapping[str, Any] | None, spec: Mapping[str, Any]) -> bool:
    """An UPDATE that leaves the pod spec and the cache opt-in as they were."""
    return (
        old is not None
        and request.object is not None
        and request.old_object is not None
        and old == spec
        and opt_in_of(request.kind, request.object) == opt_in_of(request.kind, request.old_object)
    )


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
        return {s.path: s.image for s in walk(spec_path, spec).sites()}
    except MalformedObject:
        return {}


def decide(
    plan: Plan,
    outcomes: Mapping[str, Outcome],
    policy: AdmissionPolicy,
    judge: Judge,
    endpoint: Endpoint,
    picker: Picker | None = None,
    budget: Budget = UNBOUNDED,
) -> Response:
    if plan.final is not None:
        return plan.final
    assert plan.pod is not None  # planned
    facts = Facts.of(
        pod=plan.pod,
        ways=plan.ways,
        governed=plan.governed,
        planned=plan.planned,
        caches=plan.caches,
        outcomes=outcomes,
        policy=policy,
        # Memoised for this review's ways: hundreds of containers naming one image are judged once.
        judge=judge.for_review(),
        picker=(picker or Picker(judge.catalogue, policy.gpu_match)).for_review(),
        mutate=endpoint is Endpoint.MUTATE,
        budget=budget,
    )
    found = run_rules(facts)
    code = Code.UNAVAILABLE if found.denials and all(d.outage for d in found.denials) else Code.FORBIDDEN
    return _answer(plan.request, policy, found.denials, found.notes, code=code, patch=found.patch)


def _answer(
    request: Request,
    policy: AdmissionPolicy,
    denials: Sequence[Denial],
    notes: Sequence[str],
    *,
    code: Code,
    patch: Sequence[Mapping[str, Any]] = (),
    always_deny: bool = False,
) -> Response:
    """Allowed (with the patch) without denials or in warn mode, else denied with all of them,
    one per cause, in a message of a few KiB (``bounds.message``) however many there are."""
    uid, version = request.uid, request.api_version
    if not denials:
        return Response(
            uid=uid, api_version=version, allowed=True, warnings=bounds.warnings(notes), patch=tuple(patch)
        )
    problems = [str(d) for d in denials]
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
