"""docs/signing.md promises what the code does (issue 41 item 7): the referrers listing bound is
stated with the code's numbers, nothing is promised past it, and identity regexes are RE2's."""

from __future__ import annotations

import re

from kernelbake.oci import listing
from tests.conftest import REPO

DOC = re.sub(r"\s+", " ", (REPO / "docs" / "signing.md").read_text())


def test_the_listing_bound_is_stated_and_nothing_is_promised_past_it() -> None:
    assert "any number of referrers, before or after the real ones" not in DOC
    pages, mib = listing.MAX_PAGES, listing.MAX_BYTES >> 20
    assert f"only the first {pages} pages and {mib} MiB of the listing are read" in DOC
    assert f"exceeds {listing.bound_text()}: the entries past the bound were not examined" in DOC


def test_identity_regexes_are_documented_as_re2() -> None:
    assert "They are RE2 syntax, matched by RE2 (`google-re2`)" in DOC
    assert "does not compile as RE2: invalid escape sequence" in DOC
