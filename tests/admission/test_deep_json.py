"""An AdmissionReview nested 200,000 deep (issue 41 item 6): refused as JSON nested too deep,
by either of the server's scanners (json's C one for small bodies, the Python one that yields
the GIL for bodies over YIELDING_BODY), before either recurses."""

from __future__ import annotations

import pytest

from kernelbake.admission.http.codec import YIELDING_BODY, decode
from kernelbake.contract.jsondoc import MAX_JSON_DEPTH, TooDeep

DEEP = b'{"request":' + b"[" * 200_000 + b"]" * 200_000 + b"}"


@pytest.mark.parametrize("padding", [0, YIELDING_BODY], ids=["small body", "body over YIELDING_BODY"])
def test_a_deep_review_is_refused_by_its_depth(padding: int) -> None:
    body = DEEP[:-1] + b',"pad":"' + b"x" * padding + b'"}'
    assert (len(body) > YIELDING_BODY) == bool(padding)
    with pytest.raises(
        TooDeep, match=f"JSON nested 200,001 levels deep, more than the {MAX_JSON_DEPTH} allowed"
    ):
        decode(body)


def test_a_review_within_the_depth_is_decoded_by_either_scanner() -> None:
    nested = b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1)
    for pad in (b"", b"x" * YIELDING_BODY):
        doc = decode(b'{"request":' + nested + b',"pad":"' + pad + b'"}')
        assert doc["pad"] == pad.decode()
