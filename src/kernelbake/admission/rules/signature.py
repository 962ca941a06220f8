"""Every governed image must verify (``kernelbake.signing``: a signature the policy trusts, the
kernelbake attestation, labels that rebuild the attested key, the cache manifest) as what was
asked for: the digest given, and for a GPU index the variant the pod's placement picks, with the
key the index claims for it (``sites.resolve``). The mutating endpoint pins each to the digest
that verified, except an image an UPDATE left as it was (a new image string on a running Pod
restarts its container).

A registry that could not be asked is an outage, not a verdict: denied with code 503, or with
``registry_errors: unsafe-allow`` admitted unverified and unpinned, with a warning.
"""

from __future__ import annotations

from typing import Any

from kernelbake.admission.policy import OnRegistryError
from kernelbake.admission.rules.facts import Facts, Rule
from kernelbake.admission.rules.shape import Denial, Verdict, verdict
from kernelbake.admission.rules.sites import Resolved


def check(facts: Facts) -> Verdict:
    unsafe = facts.policy.registry_errors is OnRegistryError.UNSAFE_ALLOW
    denials: list[Denial] = []
    notes: list[str] = []
    patch: list[dict[str, Any]] = []
    for g, found in facts.resolved:
        if isinstance(found, Resolved):
            pinned = g.ref.rewritten(found.subject.digest)
            if facts.mutate and pinned != g.site.image and not g.unchanged:
                patch.append({"op": "replace", "path": g.site.pointer, "value": pinned})
        elif found.outage is not None and unsafe:
            notes.append(
                f"{g.site.where}: {found.text} was admitted UNVERIFIED (registry_errors: unsafe-allow): {found.outage}"
            )
        else:
            denials.append(Denial(g.site.where, found.message, found.hint, outage=found.outage is not None))
    return verdict(denials, notes, patch)


RULE = Rule(
    "signature",
    "a governed image (container, init, ephemeral or image volume) that does not verify: unsigned or "
    "signed by no trusted identity, not found, another digest than the one given, a GPU index with no "
    "variant for every GPU the pod can land on or claiming another key for it; a registry that could not "
    "be asked is answered 503 (`registry_errors: unsafe-allow` admits it unverified, with a warning)",
    check,
)
