"""What admission denies: ``RULES``, one entry per rule, each a module of this package.

Every rule has the one shape ``check(facts) -> Verdict`` (``facts``: the pod walked once, where
it can run, what each governed image verified as; ``shape.Verdict``: ``Denial``s, notes and
the patch). The table runs them in this order (``facts.all_of``), and an empty table denies
everything. docs/admission.md's table "What admission denies" is written from it
(``python -m kernelbake.admission.rules.table --write``, ``make docs``).

Before any rule: a request that cannot change what runs is allowed; an object that is malformed,
too large to review or of a kind admission does not review is denied with code 400 (``admit``).
"""

from __future__ import annotations

from kernelbake.admission.rules import (
    cache_opt_in,
    cache_volume,
    delta,
    gpu,
    image_volume,
    reference,
    signature,
    snapshot_restore,
    trusted_paths,
)
from kernelbake.admission.rules.facts import Facts, Rule, all_of
from kernelbake.admission.rules.shape import Verdict

RULES: tuple[Rule, ...] = (
    reference.RULE,
    trusted_paths.RULE,
    signature.RULE,
    gpu.RULE,
    image_volume.RULE,
    cache_volume.RULE,
    cache_opt_in.RULE,
    delta.RULE,
    snapshot_restore.RULE,
)


def judge(facts: Facts) -> Verdict:
    """Every rule of ``RULES`` on one review."""
    return all_of(RULES, facts)
