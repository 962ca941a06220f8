"""The private parts of sigstore-python that keyless verification relies on."""

from __future__ import annotations

import importlib
import inspect

import pytest

from kernelbake.signing._internal import sigstore_private


@pytest.mark.parametrize("name", sigstore_private.__all__)
def test_each_private_name_still_exists(name: str) -> None:
    assert getattr(sigstore_private, name, None) is not None, f"sigstore no longer has {name}"


def test_the_private_names_are_used_only_through_the_seam() -> None:
    for module in ("kernelbake.signing._internal.keyless", "kernelbake.signing._internal.certs"):
        source = inspect.getsource(importlib.import_module(module))
        assert "sigstore._internal" not in source and "sigstore._utils" not in source, module


def test_verify_sct_takes_what_keyless_passes() -> None:
    # keyless calls verify_sct(leaf, chain, keyring).
    assert len(inspect.signature(sigstore_private.verify_sct).parameters) == 3
    assert hasattr(sigstore_private.KeyringPurpose, "VERIFY")


def test_the_signer_still_keeps_its_ephemeral_key_where_the_vouch_reads_it() -> None:
    # The keyless vouch signs with sigstore-python's Signer's own ephemeral key.
    from sigstore.sign import Signer

    # A property of the class (it generates and caches the key on first use).
    assert isinstance(getattr(Signer, sigstore_private.EPHEMERAL_KEY_ATTRIBUTE, None), property)


def test_no_private_attribute_of_sigstore_is_read_outside_the_seam() -> None:
    source = inspect.getsource(importlib.import_module("kernelbake.signing._internal.keyless"))
    assert sigstore_private.EPHEMERAL_KEY_ATTRIBUTE not in source
