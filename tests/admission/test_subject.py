"""Each kind of subject (``admission.subject``) has the digest and key of what verified."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kernelbake.admission.subject import CacheArtifact, Delta, Image, Snapshot, Subject


@pytest.mark.parametrize("kind", [Image, CacheArtifact, Delta, Snapshot])
def test_a_subject_has_the_digest_and_key_of_what_verified(kind: type[Subject]) -> None:
    verified = SimpleNamespace(digest="sha256:" + "1" * 64, key=object())
    subject = kind(verified, None) if kind is CacheArtifact else kind(verified)
    assert subject.digest == verified.digest and subject.key is verified.key
