"""Which variant of a model's GPU index a pod runs, from where it can schedule.

Every GPU product each of the pod's ways admits (``gpus.admitted``, as the GPU check reads
them) is ranked against the index's variants by ``contract.compat.rank_variants``, the ranking
``kernelbake resolve`` prints. The pod gets a variant only when every GPU it can land on picks
the same one; a placement that allows GPUs needing different variants is denied with the
nodeSelectors that would settle it, and a GPU no variant fits is denied with the reasons. In
``gpu.match: device`` mode only a variant baked on that very device fits; ``arch`` mode also
takes one of the same arch (the GPU check then warns that the caches recompile there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from kernelbake.admission.gpus import Admitted, admitted, listed
from kernelbake.admission.memo import Answers
from kernelbake.admission.policy import GpuMatch
from kernelbake.admission.scheduling import Way
from kernelbake.catalogue import Catalogue
from kernelbake.contract.artifact import ArtifactKind
from kernelbake.contract.compat import Candidate, Tier, rank_variants
from kernelbake.contract.variants import Variant, of_kind
from kernelbake.gfd import PRODUCT, product_for


@dataclasses.dataclass(frozen=True)
class Pick:
    """The variant to run, or why there is none (``problems``, and the fix when one exists)."""

    variant: Variant | None
    problems: tuple[str, ...] = ()
    hint: str = ""

    def __post_init__(self) -> None:
        if (self.variant is None) == (not self.problems):
            raise ValueError("a Pick has either a variant or problems")


def _label(variant: Variant) -> str:
    return f"{variant.key.device} ({variant.digest[:19]}…)"


def pick(
    variants: Sequence[Variant],
    ways: Sequence[Way],
    catalogue: Catalogue,
    match: GpuMatch,
    kind: ArtifactKind = ArtifactKind.IMAGE,
) -> Pick:
    """The entry of ``kind`` to use; a pod's image is only ever an image entry, never a cache
    artifact listed beside it."""
    variants = of_kind(variants, kind)
    if not variants:
        return Pick(None, (f"the index lists no {kind.value} entry",))
    products = ", ".join(dict.fromkeys(f"{PRODUCT}: {product_for(v.key.device)}" for v in variants))
    pin_hint = f"add one nodeSelector of {products}"
    if not ways:
        return Pick(None, ("its required node affinity has no term that matches any node",), pin_hint)
    ranker = _Ranker(variants, match)
    problems: list[str] = []
    chosen: dict[int, list[str]] = {}  # variant → the products that pick it
    for way in ways:
        found = admitted(way, catalogue)
        blocked = _blocked(found, match)
        if blocked is not None:
            problems.append(blocked)
            continue
        problems += _unknown(way, found)
        for gpu in found.gpus:
            if gpu.device is None or gpu.arch is None:
                continue
            best = ranker(way, gpu.product, gpu.device, gpu.arch)
            if isinstance(best, str):
                problems.append(best)
            else:
                chosen.setdefault(best, []).append(gpu.product)
    if problems:
        return Pick(None, tuple(problems), pin_hint)
    return _one_variant(variants, chosen)


def _blocked(found: Admitted, match: GpuMatch) -> str | None:
    """Why no variant can be picked for the way ``found`` reads at all, if so: it does not pin a
    GPU, or (device mode) pins one only by arch or memory."""
    if not found.pins_gpu:
        return found.unpinned()
    if found.open_ended and match is GpuMatch.DEVICE:
        return found.no_product()
    return None


def _unknown(way: Way, found: Admitted) -> list[str]:
    """The problems of a way whose GPUs the catalogue does not (all) know."""
    problems: list[str] = []
    if not found.gpus:
        problems.append(f"{way.source} admits no GPU product kernelbake's catalogue knows")
    unknown = [gpu.product for gpu in found.gpus if gpu.device is None or gpu.arch is None]
    if unknown:
        problems.append(f"{way.source} admits {listed(unknown)}, not a GPU product in kernelbake's catalogue")
    return problems


@dataclasses.dataclass(frozen=True)
class _Ranker:
    """The best variant for a GPU, ranked once per device and arch: products that share them
    rank the variants alike."""

    variants: Sequence[Variant]
    match: GpuMatch
    ranked_for: dict[tuple[str, str], list[Candidate]] = dataclasses.field(default_factory=dict)

    def __call__(self, way: Way, product: str, device: str, arch: str) -> int | str:
        """The index of the variant ``product`` picks, or why none fits it."""
        fits = (Tier.SAME_DEVICE,) if self.match is GpuMatch.DEVICE else (Tier.SAME_DEVICE, Tier.SAME_ARCH)
        platform = (device, arch)
        if platform not in self.ranked_for:
            keys = [v.key for v in self.variants]
            self.ranked_for[platform] = rank_variants(keys, {"device": device, "arch": arch})
        ranked = self.ranked_for[platform]
        best = ranked[0]
        if best.tier in fits:
            return best.index
        reasons = "; ".join(f"{self.variants[c.index].key.device}: {c.summary()}" for c in ranked)
        mode = f" in gpu.match: {self.match.value} mode" if best.tier is Tier.SAME_ARCH else ""
        return f"{way.source} admits {product}, which no variant fits{mode} ({reasons})"


def _one_variant(variants: Sequence[Variant], chosen: Mapping[int, list[str]]) -> Pick:
    """The variant every GPU the pod can land on picks, or the nodeSelectors that settle it."""
    if len(chosen) > 1:
        needs = "; ".join(
            f"{listed(p)} need{'s' if len(p) == 1 else ''} {_label(variants[i])}" for i, p in chosen.items()
        )
        one_of = " or ".join(f"{PRODUCT}: {p[0]}" for p in chosen.values())
        return Pick(
            None,
            (f"its placement allows GPUs that need different variants ({needs})",),
            f"add nodeSelector {one_of}",
        )
    (index,) = chosen
    return Pick(variants[index])


class Picker(Answers[Sequence[Variant], Pick]):
    """``pick`` for one catalogue and match mode, memoised like ``gpus.Judge`` (``memo``): the
    answer depends only on the index's variants and the pod's ways, and both recur."""

    def _answer(self, variants: Sequence[Variant], ways: Sequence[Way]) -> Pick:
        return pick(variants, ways, self.catalogue, self.match)
