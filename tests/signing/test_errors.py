"""Verification and signing failures quote causes from sigstore, cryptography or a registry,
which may span lines; what they print is one line (``signing.errors``)."""

from __future__ import annotations

import pytest

from kernelbake.signing.errors import ImageNotFound, SigningFailed, TokenMissing, VerificationFailed


@pytest.mark.parametrize("cls", [VerificationFailed, ImageNotFound, SigningFailed, TokenMissing])
def test_message_and_hint_are_one_line_each(cls: type[VerificationFailed | SigningFailed]) -> None:
    failed = cls("could not\n  verify\tthis", hint="try\nagain ")
    assert (failed.message, failed.hint) == ("could not verify this", "try again")
    assert cls("no hint").hint is None
