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
