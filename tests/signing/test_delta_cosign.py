"""Real cosign 3 verifies a pushed cache delta's signature and its delta attestation (replica,
base, key) with the project's key, and refuses another key: the delta is signed by the path
images are (issue 36 item 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbake.oci import RegistryClient
from kernelbake.signing.delta import DELTA_PREDICATE_TYPE, push_delta
from tests.signing.conftest import ImageFactory, KeyPair, cosign
from tests.signing.test_cosign_interop import INSECURE, attested_predicates, ok
from tests.signing.test_delta import _dir

pytestmark = [pytest.mark.cosign, pytest.mark.registry]


def test_cosign3_verifies_a_delta_and_its_attestation(
    make_image: ImageFactory,
    client: RegistryClient,
    keys: KeyPair,
    other_keys: KeyPair,
    cosign3: str,
    tmp_path: Path,
) -> None:
    base = make_image()
    pushed = push_delta(
        _dir(tmp_path, base), base=base.pinned, signer=keys.signer, client=client, replica="r-7"
    )
    common = ["--key", str(keys.public_path), "--insecure-ignore-tlog", "--new-bundle-format", INSECURE]
    assert pushed.reference.split("@")[1] in ok(cosign(cosign3, "verify", *common, pushed.reference))
    out = ok(cosign(cosign3, "verify-attestation", *common, "--type", DELTA_PREDICATE_TYPE, pushed.reference))
    (predicate,) = attested_predicates(out)
    assert predicate["replica"] == "r-7" and predicate["baseImage"]["digest"] == base.digest
    assert predicate["key"] == str(base.key)
    other = ["--key", str(other_keys.public_path), "--insecure-ignore-tlog", "--new-bundle-format", INSECURE]
    assert cosign(cosign3, "verify", *other, pushed.reference).returncode != 0
