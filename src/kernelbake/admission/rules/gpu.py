"""A container's image must have been baked for every GPU the pod can land on: each way the pod
can schedule (``scheduling.ways``) pins GPU products whose device (``gpu.match: device``) or arch
(``arch``: another device is a warning, the caches recompile there) is the one in the image's key
(``gpus.judge``). Image volumes are judged by what they hold (``cache_volume``, ``image_volume``).
"""

from __future__ import annotations

from kernelbake.admission.pod import Container
from kernelbake.admission.rules.facts import Facts, Rule
from kernelbake.admission.rules.shape import Denial, Verdict, verdict
from kernelbake.admission.rules.sites import Resolved

# Admission cannot import the engine, so the GPU verdict comes from the image's key (the
# fallback of issue 11's prediction); the pod's `kernelbake serve` asks vLLM itself.
KEY_FALLBACK = "judged from the image's key, the fallback: vLLM's own cache check runs at kernelbake serve"


def check(facts: Facts) -> Verdict:
    denials: list[Denial] = []
    notes: list[str] = []
    for g, found in facts.resolved:
        if not isinstance(g.site, Container) or not isinstance(found, Resolved):
            continue
        key = found.subject.key
        judged = facts.judge(key, facts.ways)
        if not judged.ok:
            denials.append(
                Denial(
                    g.site.where,
                    f"{found.text} was baked for {key.device} ({key.arch}) but {'; '.join(judged.problems)}",
                    f"{judged.hint} ({KEY_FALLBACK})",
                )
            )
        if judged.notes:
            # The container's label is formatted only where something is said of it.
            where = g.site.where
            notes += [f"{where}: {found.text}: {n} ({KEY_FALLBACK})" for n in judged.notes]
    return verdict(denials, notes)


RULE = Rule(
    "gpu",
    "a container whose image was baked for another GPU than one the pod can land on: a way to schedule "
    "that pins no GPU, admits a GPU product the catalogue does not know, pins only family or compute "
    "capability (`gpu.match: device`), or admits a device (or, `arch`, an arch) other than the key's",
    check,
)
