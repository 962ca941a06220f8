"""The delta's push and verification against Debian's registry (no referrers API: the fallback
tag index lists the delta, its signature and attestation beside the base's), with junk listed
first: the same checks as tests/signing/test_delta.py, on the real server."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbake.oci import RegistryClient, parse_reference
from kernelbake.signing.delta import push_delta, verify_delta
from kernelbake.signing.errors import DeltaRefused
from tests.signing.conftest import ImageFactory, KeyPair
from tests.signing.images import PushedImage
from tests.signing.tamper import list_around, push_referrer
from tests.signing.test_delta import _dir

pytestmark = pytest.mark.registry


def test_a_delta_pushed_to_debians_registry_verifies_past_junk_and_only_on_its_base(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    base, other = make_image(), make_image()
    pushed = push_delta(_dir(tmp_path, base), base=base.pinned, signer=keys.signer, client=client)
    ref = parse_reference(pushed.reference)
    listed = {d.digest for d in client.referrers(parse_reference(base.pinned))}
    assert ref.digest in listed, "the delta is a referrer of its base"
    delta = PushedImage(
        ref=ref.with_tag("d"), digest=str(ref.digest), key=base.key, labels={}, cache_manifest=b""
    )
    list_around(client, delta, [push_referrer(client, delta, b'{"junk": %d}' % i) for i in range(4)], [])
    verified = verify_delta(pushed.tagged, base=base.pinned, policy=keys.policy(), client=client)
    assert verified.manifest_digest == pushed.manifest_digest and verified.skipped
    with pytest.raises(DeltaRefused, match="but the pod's image is"):
        verify_delta(pushed.reference, base=other.pinned, policy=keys.policy(), client=client)
