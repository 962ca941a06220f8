"""A cache delta pushed layered on its base image, signed and attested, and verified as
admission does (issue 36 items 1, 2, 4, host side): only a delta whose signature the policy
trusts, whose subject and delta.json name the pod's image and whose key is that image's passes;
junk referrers beside the signature are passed over; nothing is pushed from a directory whose
files are not what delta.json says, nor for a base the delta was not captured from."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.contract.delta import ARTIFACT_TYPE, DELTA_MANIFEST, DeltaFile, DeltaManifest, Origin, Rebuild
from kernelbake.contract.layout import CacheKind
from kernelbake.errors import BadInput
from kernelbake.oci import RegistryClient, parse_reference
from kernelbake.oci import types as mt
from kernelbake.signing import formats, intoto
from kernelbake.signing.delta import DELTA_PREDICATE_TYPE, push_delta, verify_delta
from kernelbake.signing.errors import DeltaRefused, VerificationFailed
from kernelbake.signing.sign import sign_image
from tests.signing.conftest import ImageFactory, KeyPair
from tests.signing.images import PushedImage
from tests.signing.tamper import list_around, push_referrer
from tests.support.attacks import attach_statement

FILES = {"triton/tk1/kernel.cubin": b"cubin", "inductor/fxgraph/ab/fk1/entry": b"graph"}


@pytest.fixture(scope="module")
def image_registry(memory_registry: str) -> str:
    return memory_registry


RECORD = "sha256:" + "5" * 64


def _dir(
    tmp_path: Path,
    base: PushedImage,
    files: dict[str, bytes] = FILES,
    origin: Origin = Origin.REBUILT,
    **changes: str,
) -> Path:
    """What ``capture rebuild`` writes for a record of a replica of ``base`` (``origin``
    ``REPLICA``: what ``capture collect`` writes in the replica itself)."""
    out = tmp_path / "delta"
    entries = []
    for rel, data in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
        kind = CacheKind(rel.split("/")[0])
        entries.append(
            DeltaFile(path=rel, size=len(data), sha256=hashlib.sha256(data).hexdigest(), kind=kind)
        )
    delta = DeltaManifest(
        key=base.key,
        base_image=None,
        base_manifest=changes.get("base_manifest", mt.sha256_digest(base.cache_manifest)),
        files=tuple(entries),
        replica="replica-0",
        origin=origin,
        rebuild=Rebuild(builder="builder-1", image=changes.get("rebuilt_from", base.digest), record=RECORD)
        if origin is Origin.REBUILT
        else None,
    )
    (out / DELTA_MANIFEST).write_text(delta.to_json())
    return out


def test_a_pushed_delta_is_a_signed_attested_referrer_of_its_base_and_verifies(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    base = make_image()
    pushed = push_delta(_dir(tmp_path, base), base=base.pinned, signer=keys.signer, client=client)
    ref = parse_reference(pushed.reference)
    top = client.get_manifest(ref)
    assert top.artifact_type == ARTIFACT_TYPE and top.subject is not None
    assert top.subject.digest == base.digest
    assert pushed.reference in {
        f"{ref.name}@{d.digest}" for d in client.referrers(ref.with_digest(base.digest))
    }
    verified = verify_delta(pushed.tagged, base=base.pinned, policy=keys.policy(), client=client)
    assert verified.manifest_digest == pushed.manifest_digest and verified.files == 2
    assert verified.to_json()["verified"] is True
    # The attestation says which replica, which base, which key.
    kinds = {a.artifact_type for a in client.referrers(ref)}
    assert formats.BUNDLE_V03 in kinds
    bundles = [d for d in client.referrers(ref) if d.annotations.get(formats.ANN_BUNDLE_PREDICATE)]
    assert {d.annotations[formats.ANN_BUNDLE_PREDICATE] for d in bundles} == {
        intoto.COSIGN_SIGN_PREDICATE,
        DELTA_PREDICATE_TYPE,
    }


def test_a_delta_signed_by_a_foreign_key_is_refused(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, other_keys: KeyPair, tmp_path: Path
) -> None:
    base = make_image()
    pushed = push_delta(_dir(tmp_path, base), base=base.pinned, signer=other_keys.signer, client=client)
    with pytest.raises(VerificationFailed, match=r"no trusted signature.*the policy trusts"):
        verify_delta(pushed.reference, base=base.pinned, policy=keys.policy(), client=client)


def test_a_delta_for_another_base_is_refused(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    base, other = make_image(), make_image()
    pushed = push_delta(_dir(tmp_path, base), base=base.pinned, signer=keys.signer, client=client)
    with pytest.raises(
        DeltaRefused, match=f"layered on {base.digest}, but the pod's image is {other.digest}"
    ):
        verify_delta(pushed.reference, base=other.pinned, policy=keys.policy(), client=client)


def test_junk_referrers_beside_the_signature_are_passed_over(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, other_keys: KeyPair, tmp_path: Path
) -> None:
    base = make_image()
    pushed = push_delta(_dir(tmp_path, base), base=base.pinned, signer=keys.signer, client=client)
    ref = parse_reference(pushed.reference)
    delta = PushedImage(
        ref=ref.with_tag("delta"), digest=str(ref.digest), key=base.key, labels={}, cache_manifest=b""
    )
    junk = [push_referrer(client, delta, b'{"junk": %d}' % i) for i in range(8)]
    list_around(client, delta, junk, [])
    attach_statement(
        pushed.reference, other_keys.signer, DELTA_PREDICATE_TYPE, {"replica": "evil"}, client=client
    )
    verified = verify_delta(pushed.reference, base=base.pinned, policy=keys.policy(), client=client)
    assert verified.skipped, "the junk is passed over with a note"
    # Junk alone, no trusted signature: refused.
    unsigned = push_delta(
        _dir(tmp_path / "u", base, {"triton/tk2/k": b"k"}),
        base=base.pinned,
        signer=other_keys.signer,
        client=client,
    )
    with pytest.raises(VerificationFailed):
        verify_delta(unsigned.reference, base=base.pinned, policy=keys.policy(), client=client)


def test_nothing_is_pushed_from_a_tampered_directory_or_for_a_base_it_was_not_captured_from(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    base = make_image()
    d = _dir(tmp_path / "t", base)
    (d / "triton/tk1/kernel.cubin").write_bytes(b"CUBIN")
    with pytest.raises(BadInput, match=r"delta\.json records"):
        push_delta(d, base=base.pinned, signer=keys.signer, client=client)
    d = _dir(tmp_path / "b", base, base_manifest="sha256:" + "e" * 64)
    with pytest.raises(DeltaRefused, match="the base image pins"):
        push_delta(d, base=base.pinned, signer=keys.signer, client=client)
    with pytest.raises(BadInput, match="pinned by digest"):
        push_delta(_dir(tmp_path / "c", base), base=base.tagged, signer=keys.signer, client=client)
    assert client.referrers(parse_reference(base.pinned)) == []


def test_a_delta_that_would_overwrite_a_baked_file_is_refused_at_push(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    base = make_image()
    baked = json.loads(base.cache_manifest)["files"][0]["path"]
    d = _dir(tmp_path, base, {**FILES, baked: b"other bytes"})
    with pytest.raises(DeltaRefused, match="would replace baked files"):
        push_delta(d, base=base.pinned, signer=keys.signer, client=client)


def test_the_cli_pushes_and_verifies(
    client: RegistryClient,
    make_image: ImageFactory,
    keys: KeyPair,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = make_image()
    sign_image(base.pinned, keys.signer, client=client, attest=False)
    d = _dir(tmp_path, base)
    to = f"{base.ref.name}:v1-delta"
    # A replica's own bytes need the unsafe flag, named.
    replica = _dir(tmp_path / "replica", base, origin=Origin.REPLICA)
    argv = ["capture", "push", str(replica), "--base", base.pinned, "--key", str(keys.private_path)]
    assert main(argv) == 2
    assert "--unsafe-replica-bytes" in capsys.readouterr().err
    assert (
        main(
            [
                "capture",
                "push",
                str(d),
                "--base",
                base.pinned,
                "--to",
                to,
                "--key",
                str(keys.private_path),
                "--json",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    pushed = json.loads(out[out.index("{") :])
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"keys: [{keys.public_path}]\n")
    assert main(["capture", "verify", to, "--base", base.pinned, "--policy", str(policy), "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{") :])["manifest_digest"] == pushed["manifest_digest"]


def _predicate(client: RegistryClient, reference: str) -> dict[str, object]:
    """The delta's attestation predicate, as pushed (the bundle's DSSE payload)."""
    import base64

    ref = parse_reference(reference)
    (bundle,) = [
        d
        for d in client.referrers(ref)
        if d.annotations.get(formats.ANN_BUNDLE_PREDICATE) == DELTA_PREDICATE_TYPE
    ]
    manifest = client.get_manifest(ref.with_digest(bundle.digest))
    doc = json.loads(client.get_blob(ref, manifest.layers[0].digest))
    statement = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    predicate: dict[str, object] = statement["predicate"]
    return predicate


def test_a_rebuilt_delta_says_who_rebuilt_it_in_its_attestation_and_verification(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    base = make_image()
    pushed = push_delta(_dir(tmp_path, base), base=base.pinned, signer=keys.signer, client=client)
    assert pushed.origin == "rebuilt" and "rebuilt by builder-1" in pushed.describe()
    predicate = _predicate(client, pushed.reference)
    assert predicate["origin"] == "rebuilt"
    assert predicate["rebuild"] == {
        "builder": "builder-1",
        "image": base.digest,
        "record": RECORD,
        "dropped": [],
    }
    verified = verify_delta(pushed.reference, base=base.pinned, policy=keys.policy(), client=client)
    assert verified.origin == "rebuilt" and verified.builder == "builder-1"
    assert "rebuilt by builder-1" in verified.describe() and "UNSAFE" not in verified.describe()


def test_a_replica_signed_delta_is_pushed_only_as_unsafe_and_refused_by_the_default_policy(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    base = make_image()
    d = _dir(tmp_path, base, origin=Origin.REPLICA)
    with pytest.raises(BadInput, match="--unsafe-replica-bytes"):
        push_delta(d, base=base.pinned, signer=keys.signer, client=client)
    assert client.referrers(parse_reference(base.pinned)) == [], "nothing was pushed"
    pushed = push_delta(d, base=base.pinned, signer=keys.signer, client=client, unsafe_replica_bytes=True)
    assert pushed.origin == "replica" and "UNSAFE" in pushed.describe()
    predicate = _predicate(client, pushed.reference)
    assert predicate["origin"] == "replica" and predicate["rebuild"] is None
    with pytest.raises(DeltaRefused, match=r"origin replica.*verify\.unsafe_replica_deltas: true"):
        verify_delta(pushed.reference, base=base.pinned, policy=keys.policy(), client=client)
    unsafe = dataclasses.replace(keys.policy(), unsafe_replica_deltas=True)
    verified = verify_delta(pushed.reference, base=base.pinned, policy=unsafe, client=client)
    assert verified.origin == "replica"
    assert "UNSAFE" in verified.describe() and "verify.unsafe_replica_deltas" in verified.describe()


def test_a_delta_written_before_origins_is_a_replicas_and_refused(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    # delta.json without "origin" (as capture wrote it before): the replica's bytes.
    base = make_image()
    d = _dir(tmp_path, base, origin=Origin.REPLICA)
    doc = json.loads((d / DELTA_MANIFEST).read_text())
    del doc["origin"], doc["rebuild"]
    (d / DELTA_MANIFEST).write_text(json.dumps(doc))
    pushed = push_delta(d, base=base.pinned, signer=keys.signer, client=client, unsafe_replica_bytes=True)
    with pytest.raises(DeltaRefused, match="origin replica"):
        verify_delta(pushed.reference, base=base.pinned, policy=keys.policy(), client=client)


def test_a_delta_rebuilt_from_another_image_is_refused_at_push_with_both_digests(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    base, other = make_image(), make_image()
    d = _dir(tmp_path, base, rebuilt_from=other.digest)
    with pytest.raises(
        DeltaRefused, match=f"rebuilt from the image {other.digest}, not the base {base.digest}"
    ):
        push_delta(d, base=base.pinned, signer=keys.signer, client=client)


def test_without_to_each_base_gets_its_own_tag_and_neither_overwrites_the_other(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    # Two bases in one repository: before, both deltas went to the tag base-delta.
    repo = f"kb/{uuid.uuid4().hex[:10]}"
    first, second = make_image(repo=repo), make_image(repo=repo, tag="v2")
    a = push_delta(_dir(tmp_path / "a", first), base=first.pinned, signer=keys.signer, client=client)
    b = push_delta(_dir(tmp_path / "b", second), base=second.pinned, signer=keys.signer, client=client)
    assert a.tagged == f"{first.ref.name}:delta-{first.digest.replace(':', '-')}"
    assert b.tagged != a.tagged
    # Each tag still names its base's delta, which verifies on that base only.
    assert (
        verify_delta(a.tagged, base=first.pinned, policy=keys.policy(), client=client).base_digest
        == first.digest
    )
    assert (
        verify_delta(b.tagged, base=second.pinned, policy=keys.policy(), client=client).base_digest
        == second.digest
    )
    with pytest.raises(
        DeltaRefused, match=f"layered on {first.digest}, but the pod's image is {second.digest}"
    ):
        verify_delta(a.tagged, base=second.pinned, policy=keys.policy(), client=client)
