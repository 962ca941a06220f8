"""Referrers listings of any length and size: every page the referrers API links is read (OCI
distribution spec, ``Link: <url>; rel="next"``), within a bound on pages and bytes; a listing
past the bound still gives what lies before it, and says where it was cut.

The paged API is the in-memory registry's (Debian's docker-registry has none), and so is the
fallback index past 4 MiB (Debian's refuses manifests that large)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from kernelbake.oci import RegistryClient, RegistryProtocolError, fallback_tag, listing
from kernelbake.oci import types as mt
from kernelbake.settings import Settings
from kernelbake.signing import formats
from kernelbake.signing.errors import RegistryMisbehaved, Unsigned
from kernelbake.signing.sign import sign_image
from kernelbake.signing.verify import verify_image
from tests.signing.conftest import KeyPair
from tests.signing.images import PushedImage, push_image
from tests.signing.tamper import list_around, list_referrers, push_referrer
from tests.support.memregistry import Store, memory_registry

SBOM = "application/vnd.example.sbom.v1+json"
BIG = 60_000  # bytes of annotation on one junk referrer: 80 of them make a 4.8 MB listing


@pytest.fixture
def paged(settings: Settings) -> Iterator[tuple[str, Store]]:
    """A registry with the referrers API, 20 referrers a page."""
    with memory_registry(referrers_api=True, page_size=20) as found:
        yield found


def _junk(client: RegistryClient, image: PushedImage, count: int, annotation: int = 0) -> None:
    for i in range(count):
        notes = {"junk": f"{i}:" + "x" * annotation} if annotation else None
        push_referrer(
            client, image, b'{"sbom": %d}' % i, artifact_type=SBOM, layer_type=SBOM, annotations=notes
        )


@pytest.mark.parametrize("link", ["relative", "absolute"])
def test_junk_pushed_before_the_signing_spills_it_onto_later_pages(
    paged: tuple[str, Store], settings: Settings, keys: KeyPair, tmp_path: Path, link: str
) -> None:
    # The report: 150 junk referrers pushed before a digest was signed denied the signed image,
    # its signature being past the first page.
    addr, store = paged
    if link == "absolute":
        store.link_base = f"http://{addr}"
    client = RegistryClient(settings)
    image = push_image(client, f"{addr}/kb/paged:v1", tmp_path / "img")
    _junk(client, image, 150)
    sign_image(image.tagged, keys.signer, client=client)
    fresh = RegistryClient(settings)
    store.pages_served = 0
    entries = fresh.referrers(image.ref.with_digest(image.digest))
    assert len(entries) == 152 and store.pages_served == 8
    verified = verify_image(image.pinned, keys.policy(), client=fresh)
    assert verified.signer == f"key {keys.public.fingerprint}"
    note = verified.skipped_note()
    assert note is not None and "150 times: not a Sigstore bundle" in note, note


def test_a_re_signing_with_a_rotated_key_after_junk_verifies(
    paged: tuple[str, Store], settings: Settings, keys: KeyPair, other_keys: KeyPair, tmp_path: Path
) -> None:
    addr, _ = paged
    client = RegistryClient(settings)
    image = push_image(client, f"{addr}/kb/rotated:v1", tmp_path / "img")
    sign_image(image.tagged, other_keys.signer, client=client)  # the old key
    _junk(client, image, 150)
    sign_image(image.tagged, keys.signer, client=client)  # the new key, on page 8
    verified = verify_image(image.pinned, keys.policy(), client=RegistryClient(settings))
    assert verified.signer == f"key {keys.public.fingerprint}"


def test_a_listing_over_4_mib_of_annotations_verifies(
    settings: Settings, keys: KeyPair, tmp_path: Path
) -> None:
    # One page of 4.8 MB (80 junk referrers with 60 KB of annotations each): the page limit was
    # a manifest's 4 MiB, and the listing failed whole.
    with memory_registry(referrers_api=True) as (addr, _):
        client = RegistryClient(settings)
        image = push_image(client, f"{addr}/kb/fat:v1", tmp_path / "img")
        _junk(client, image, 80, BIG)
        sign_image(image.tagged, keys.signer, client=client)
        verified = verify_image(image.pinned, keys.policy(), client=RegistryClient(settings))
        assert verified.signer == f"key {keys.public.fingerprint}"


def test_the_page_bound_stops_the_listing_and_says_so(
    settings: Settings, keys: KeyPair, tmp_path: Path
) -> None:
    with memory_registry(referrers_api=True, page_size=1) as (addr, store):
        client = RegistryClient(settings)
        image = push_image(client, f"{addr}/kb/pages:v1", tmp_path / "img")
        sign_image(image.tagged, keys.signer, client=client)
        _junk(client, image, listing.MAX_PAGES + 10)
        store.pages_served = 0
        found = RegistryClient(settings).referrer_listing(image.ref.with_digest(image.digest))
        assert store.pages_served == listing.MAX_PAGES and len(found.entries) == listing.MAX_PAGES
        assert found.cut == (
            f"referrers listing of {image.ref.name}@{image.digest} exceeds "
            f"{listing.MAX_PAGES} pages/{listing.MAX_BYTES >> 20} MiB"
        )
        # The signature, listed first, is within the bound; the note names the bound.
        verified = verify_image(image.pinned, keys.policy(), client=RegistryClient(settings))
        note = verified.skipped_note()
        assert note is not None and f"exceeds {listing.MAX_PAGES} pages/8 MiB" in note, note


def test_a_next_page_on_another_host_is_not_followed(
    paged: tuple[str, Store], settings: Settings, keys: KeyPair, tmp_path: Path
) -> None:
    addr, store = paged
    client = RegistryClient(settings)
    image = push_image(client, f"{addr}/kb/elsewhere:v1", tmp_path / "img")
    _junk(client, image, 30)
    sign_image(image.tagged, keys.signer, client=client)
    port = addr.rsplit(":", 1)[1]
    for base in (f"http://127.0.0.2:{port}", f"https://{addr}", f"http://localhost:{port}"):
        store.link_base = base
        with pytest.raises(RegistryProtocolError) as failed:
            RegistryClient(settings).referrers(image.ref.with_digest(image.digest))
        assert "links its next page on another host" in str(failed.value) and base in str(failed.value)
        with pytest.raises(RegistryMisbehaved, match="links its next page on another host"):
            verify_image(image.pinned, keys.policy(), client=RegistryClient(settings))


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    seen: list[int] = []
    real = requests.Response.iter_content

    def counting(self: requests.Response, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for chunk in real(self, *args, **kwargs):
            seen.append(len(chunk))
            yield chunk

    monkeypatch.setattr(requests.Response, "iter_content", counting)
    return seen


def test_a_page_past_the_byte_bound_is_read_to_the_bound_and_keeps_what_lies_before(
    settings: Settings, keys: KeyPair, tmp_path: Path, bytes_read: list[int]
) -> None:
    with memory_registry(referrers_api=True) as (addr, _):
        client = RegistryClient(settings)
        image = push_image(client, f"{addr}/kb/huge:v1", tmp_path / "img")
        sign_image(image.tagged, keys.signer, client=client)
        _junk(client, image, 200, BIG)  # 12 MB of listing after the signature
        bytes_read.clear()
        found = RegistryClient(settings).referrer_listing(image.ref.with_digest(image.digest))
        assert sum(bytes_read) <= listing.MAX_BYTES + (64 << 10)
        assert found.cut is not None and found.cut.endswith("exceeds 64 pages/8 MiB")
        # The two signature referrers, then as many junk as lie whole in 8 MiB.
        whole = listing.MAX_BYTES // (BIG + 300)
        assert (
            whole < len(found.entries) <= 2 + listing.MAX_BYTES // BIG
            and found.entries[0].artifact_type == formats.BUNDLE_V03
        )
        verified = verify_image(image.pinned, keys.policy(), client=RegistryClient(settings))
        assert verified.signer == f"key {keys.public.fingerprint}"


# -- the fallback index: one document of any size --------------------------------------------
# Debian's docker-registry refuses a manifest over 4 MiB (400), so there the index cannot grow
# past that; registries that take larger ones exist, and the in-memory one (without the
# referrers API, as Debian's) stands for them.


def _fat_entries(client: RegistryClient, image: PushedImage, count: int) -> list[dict[str, Any]]:
    # One junk manifest, listed ``count`` times with fat annotations: the listing is what is big.
    entry = push_referrer(client, image, b'{"sbom": 0}', artifact_type=SBOM, layer_type=SBOM)
    return [{**entry, "annotations": {"junk": f"{i}:" + "x" * BIG}} for i in range(count)]


@pytest.fixture
def unpaged(settings: Settings) -> Iterator[tuple[str, RegistryClient]]:
    with memory_registry() as (addr, _):
        yield addr, RegistryClient(settings)


def test_a_fallback_index_over_4_mib_verifies(
    unpaged: tuple[str, RegistryClient], settings: Settings, keys: KeyPair, tmp_path: Path
) -> None:
    addr, client = unpaged
    image = push_image(client, f"{addr}/kb/fat-index:v1", tmp_path / "img")
    sign_image(image.tagged, keys.signer, client=client)
    list_referrers(client, image, _fat_entries(client, image, 80))  # before the signature
    verified = verify_image(image.pinned, keys.policy(), client=RegistryClient(settings))
    assert verified.signer == f"key {keys.public.fingerprint}"
    note = verified.skipped_note()
    assert note is not None and "80 times: not a Sigstore bundle" in note, note


def test_a_fallback_index_past_the_bound_keeps_its_head_and_names_the_bound(
    unpaged: tuple[str, RegistryClient], settings: Settings, keys: KeyPair, tmp_path: Path
) -> None:
    addr, client = unpaged
    image = push_image(client, f"{addr}/kb/huge-index:v1", tmp_path / "img")
    sign_image(image.tagged, keys.signer, client=client)
    ref = image.ref.with_digest(image.digest)
    list_around(client, image, [{"not": "a descriptor"}], _fat_entries(client, image, 200))
    verified = verify_image(image.pinned, keys.policy(), client=RegistryClient(settings))
    assert verified.signer == f"key {keys.public.fingerprint}"
    note = verified.skipped_note()
    tag = fallback_tag(image.digest)
    bound = f"referrers listing of {ref.name}@{image.digest} (fallback tag {tag}) exceeds 8 MiB"
    assert note is not None and bound in note, note
    assert "listed entries that are no descriptor" in note, note

    # With nothing to verify in what was read, the failure names the bound.
    unsigned = push_image(client, f"{addr}/kb/huge-index:unsigned", tmp_path / "unsigned", salt="u")
    index = mt.encode_json(
        {"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": _fat_entries(client, unsigned, 200)}
    )
    client.put_manifest(unsigned.ref.with_tag(fallback_tag(unsigned.digest)), index, mt.OCI_INDEX)
    with pytest.raises(Unsigned) as failed:
        verify_image(unsigned.pinned, keys.policy(), client=RegistryClient(settings))
    assert "exceeds 8 MiB: the entries past the bound were not examined" in str(failed.value), failed.value


def test_a_cut_index_gives_the_entries_whole_before_the_cut() -> None:
    entries = [{"mediaType": mt.OCI_MANIFEST, "digest": f"sha256:{i:064x}", "size": i} for i in range(3)]
    doc = json.dumps({"schemaVersion": 2, "manifests": entries, "annotations": {"a": "b"}}).encode()
    assert listing.index_entries(doc, complete=True, source="t") == entries
    for cut in range(len(doc)):
        got = listing.index_entries(doc[:cut], complete=False, source="t")
        assert got == entries[: len(got)]
        whole = sum(1 for e in entries if doc.index(json.dumps(e).encode()) + len(json.dumps(e)) <= cut)
        assert len(got) == whole


# -- the bound, exactly (docs/signing.md "The vouch"): junk before the signature that fills it --


def test_junk_before_the_signature_that_fills_the_page_bound_hides_it_and_fails_closed(
    settings: Settings, keys: KeyPair, tmp_path: Path
) -> None:
    with memory_registry(referrers_api=True, page_size=1) as (addr, _):
        client = RegistryClient(settings)
        image = push_image(client, f"{addr}/kb/buried:v1", tmp_path / "img")
        _junk(client, image, listing.MAX_PAGES)  # one entry a page: the signature is on page 65
        sign_image(image.tagged, keys.signer, client=client)
        with pytest.raises(Unsigned) as failed:
            verify_image(image.pinned, keys.policy(), client=RegistryClient(settings))
        assert f"exceeds {listing.bound_text()}: the entries past the bound were not examined" in str(
            failed.value
        ), failed.value
        # One junk entry fewer, and the signature is on the last page read: it verifies.
        again = push_image(client, f"{addr}/kb/buried:v2", tmp_path / "img2", salt="v2")
        _junk(client, again, listing.MAX_PAGES - 2)  # the signature and the attestation: pages 63, 64
        sign_image(again.tagged, keys.signer, client=client)
        assert verify_image(again.pinned, keys.policy(), client=RegistryClient(settings)).signer


def test_three_referrers_with_3_mib_of_annotations_before_the_signature_fill_the_byte_bound(
    settings: Settings, keys: KeyPair, tmp_path: Path
) -> None:
    with memory_registry(referrers_api=True) as (addr, _):
        client = RegistryClient(settings)
        image = push_image(client, f"{addr}/kb/fat-before:v1", tmp_path / "img")
        # Each under the 4 MiB that registries take for a manifest; the listing copies them.
        _junk(client, image, 3, 3 << 20)
        sign_image(image.tagged, keys.signer, client=client)
        with pytest.raises(Unsigned, match=f"exceeds {listing.bound_text()}: the entries past the bound"):
            verify_image(image.pinned, keys.policy(), client=RegistryClient(settings))
