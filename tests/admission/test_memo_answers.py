"""``memo.Answers``, what ``gpus.Judge`` and ``variants.Picker`` share: one memo across reviews and,
per review, one in front of it."""

from __future__ import annotations

from collections.abc import Sequence

from kernelbake.admission.memo import Answers
from kernelbake.admission.policy import GpuMatch
from kernelbake.admission.scheduling import Operator, Requirement, Way
from kernelbake.catalogue import load_catalogue
from kernelbake.gfd import PRODUCT


class Counting(Answers[str, str]):
    def __init__(self) -> None:
        super().__init__(load_catalogue(), GpuMatch.DEVICE)
        self.asked = 0  # calls that reach this object's own __call__
        self.computed = 0

    def _answer(self, thing: str, ways: Sequence[Way]) -> str:
        self.computed += 1
        return f"{thing} on {len(ways)} ways"

    def __call__(self, thing: str, ways: Sequence[Way]) -> str:
        self.asked += 1
        return super().__call__(thing, ways)


WAYS = (Way("test", (Requirement(PRODUCT, Operator.IN, ("NVIDIA-H100-80GB-HBM3",)),)),)


def test_a_review_asks_the_shared_memo_once_and_the_shared_memo_computes_once() -> None:
    shared = Counting()
    review = shared.for_review()
    assert review is not shared and review.for_review() is review
    assert (review.catalogue, review.match) == (shared.catalogue, shared.match)
    assert [review("x", WAYS) for _ in range(3)] == ["x on 1 ways"] * 3
    assert (shared.asked, shared.computed) == (1, 1)
    # The next review has a memo of its own, in front of the same shared one.
    assert shared.for_review()("x", WAYS) == "x on 1 ways"
    assert (shared.asked, shared.computed) == (2, 1)
