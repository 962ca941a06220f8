"""Find the signature artifacts attached to a digest, in both formats, within bounds.

Anyone who may push to a repository can attach referrers to its images, and other tools attach
their own (SBOMs, scan reports). None of that may deny a correctly signed image or make
verification slow. As cosign does, verification tries every candidate and one that satisfies the
policy is enough (``verify``); here, finding them:

* what cannot be a signature is passed over from the listing alone, with nothing fetched: another
  ``artifactType``, not an OCI manifest, a declared size over the limit, a malformed digest;
* every listed referrer is scanned for kernelbake's vouch (``formats.ANN_VOUCH_*``: the bundle
  layer's digest signed, with the subject, by the signing key, or for keyless signing by the key
  of the Fulcio certificate the vouch carries). A vouch by a trusted key, or by a certificate
  for a trusted identity that chains to the trusted root, is checked from the listing (nothing
  fetched: one ECDSA verification per distinct vouch, one chain check per distinct
  certificate), and the bundles vouched for are read first, by the layer digest that was
  signed. Junk cannot forge a vouch, and copying one only names the real bundle again, so no
  number of look-alike referrers hides a bundle signed by kernelbake; one that claims a trusted
  signer's vouch that does not verify is junk and is not fetched at all;
* the rest (cosign's bundles, which carry no vouch) are chosen by listed artifactType and
  position alone, never by annotations (which junk copies): of each artifactType, all up to
  ``MAX_BUNDLES``, else the oldest and the newest half of that, so junk appended after a signing
  (any amount, any type; cosign 3 rewrites the fallback index in digest order, so "after" is
  after cosign last wrote it) never pushes a bundle out, nor does junk of another artifactType
  whenever it was pushed; annotations only order what was chosen. At most ``MAX_BUNDLES`` of
  each artifactType and ``MAX_LEGACY_LAYERS`` layers of each legacy tag are fetched, each read
  with a size limit (never downloaded whole). Nothing in the listing tells such a bundle from
  junk of its own artifactType, so more than ``MAX_BUNDLES // 2`` of those listed both before
  and after it (pushed before the signing, or by whoever may rewrite the fallback tag) can still
  hide it: docs/guarantees.md "Faults and time bounds";
* the listing is read within the client's bounds (``kernelbake.oci.listing``: every page the
  API links, at most 64 pages and 8 MiB in all); what lies past them is not examined, and the
  note (and the failure, if nothing verified) says so, naming the bound;
* a candidate that cannot be read (listed but gone, over the limit, not what its digest names) is
  skipped with a note, not an error.

Registry trouble (unreachable, 5xx, refused) is not junk and propagates: "could not ask" must not
read as "asked and found nothing".
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from kernelbake.contract.delta import ARTIFACT_TYPE as DELTA_ARTIFACT_TYPE
from kernelbake.oci import Descriptor, Reference, RegistryClient, RegistryNotFound, RegistryProtocolError
from kernelbake.oci import types as mt
from kernelbake.oci.reference import is_digest
from kernelbake.signing import formats
from kernelbake.signing.keys import PublicKey

if TYPE_CHECKING:
    from kernelbake.signing._internal.keyless import Identity, VouchChecker

# Bounds, so that junk costs little. kernelbake writes two bundle referrers per signing (signature
# and attestation) and, with --legacy, one layer in each of .sig and .att: 32 referrers and 16
# layers per tag hold many re-signings (several keys, a key rotation) of one digest. The worst junk
# can cause is then 2 * 32 * (referrer manifest + bundle: 32 of each of the two listed artifactType
# kinds) + 32 vouched bundles (trusted signers' own)
# + 2 * (legacy manifest + 16 layers) reads of at most these sizes, about 50 MiB, all under the
# client's deadlines; and per listed referrer that claims a trusted signer's vouch, one ECDSA
# verification (and for a keyless vouch one certificate chain check per distinct certificate),
# the listing itself being at most the client's 8 MiB listing bound (a referrer carrying a key
# vouch is ~700 bytes listed: about 12,000 of them; one with a keyless vouch ~1.4 KiB with the
# mock Sigstore's certificates: about 6,000; bench/junk_referrers.py measures the whole verify).
MAX_BUNDLES = 32
MAX_LEGACY_LAYERS = 16
# Bundles measured in tests/signing: key-based 0.7-2.6 KiB, keyless (certificate chain and
# transparency-log proof) 4.7-6.7 KiB; a legacy layer (payload or DSSE envelope) under 3 KiB.
# 256 KiB is ample headroom.
MAX_ARTIFACT_BYTES = 256 << 10
# A bundle referrer manifest is about 0.8 KiB: it lists one layer.
MAX_REFERRER_MANIFEST_BYTES = 64 << 10
# A .sig/.att manifest grows by one layer descriptor per signature: ~0.5 KiB key-based, ~5 KiB
# keyless (certificate annotations).
MAX_LEGACY_MANIFEST_BYTES = 256 << 10


class Kind(enum.Enum):
    """The format a signature artifact was found in: a Sigstore bundle, or cosign's legacy tags."""

    BUNDLE = "bundle"
    LEGACY_SIGNATURE = "legacy-signature"
    LEGACY_ATTESTATION = "legacy-attestation"


@dataclasses.dataclass(frozen=True)
class Artifact:
    """One signature artifact found for the digest, its bytes read (within bounds), not yet verified."""

    kind: Kind
    origin: str  # where it was found, in full, for messages
    data: bytes
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    name: str = ""  # short, beside the image's name: "bundle sha256:1a2b3c4d5e6f", ".sig layer 0"


@dataclasses.dataclass(frozen=True)
class Skipped:
    """Something attached to the digest that was not used, and why; ``count`` alike ones."""

    origin: str  # short (``Artifact.name``): messages name the image already
    reason: str
    count: int = 1


@dataclasses.dataclass(frozen=True)
class Found:
    """What discovery found for a digest: the artifacts to try, and what it passed over."""

    artifacts: tuple[Artifact, ...]
    skipped: tuple[Skipped, ...]


def _shown(text: str | None) -> str:
    """Attacker-chosen text, quoted and cut short, for one-line messages."""
    return repr(text if text is None or len(text) <= 60 else text[:57] + "...")


class _Tally:
    """Skips by category: the listing may hold thousands of entries; messages stay short."""

    def __init__(self) -> None:
        self._groups: dict[str, Skipped] = {}
        self._items: list[Skipped] = []

    def group(self, category: str, origin: str, reason: str) -> None:
        first = self._groups.get(category)
        if first is None:
            self._groups[category] = Skipped(origin, reason)
        else:
            self._groups[category] = dataclasses.replace(first, count=first.count + 1)

    def item(self, origin: str, reason: str, *, count: int = 1) -> None:
        self._items.append(Skipped(origin, reason, count))

    def result(self) -> tuple[Skipped, ...]:
        return (*self._items, *self._groups.values())


# The artifactType a listing gives a bundle referrer: its own, or (cosign 3 writes the fallback
# index this way, from the manifest's config) the empty config's media type, or none at all.
_MAYBE_BUNDLE = (*formats.BUNDLE_MEDIA_TYPES, mt.OCI_EMPTY, None)


def _listing_problem(desc: Descriptor) -> tuple[str, str] | None:
    """(category, reason) when the listing alone shows ``desc`` is no bundle we would read."""
    if desc.media_type != mt.OCI_MANIFEST:
        return "media-type", f"not an OCI image manifest (mediaType {_shown(desc.media_type)})"
    if desc.artifact_type == DELTA_ARTIFACT_TYPE:
        # `capture push` layers a delta on its base image (OCI subject), so it is listed among the
        # image's referrers; naming it a stranger ("not a Sigstore bundle") misled readers.
        return "cache-delta", "kernelbake's cache delta for this image (kernelbake capture verify checks it)"
    if desc.artifact_type not in _MAYBE_BUNDLE:
        return "artifact-type", f"not a Sigstore bundle (artifactType {_shown(desc.artifact_type)})"
    if not is_digest(desc.digest):
        return "digest", f"malformed digest {_shown(desc.digest)}"
    if desc.size > MAX_REFERRER_MANIFEST_BYTES:
        return "size", f"manifest of {desc.size} bytes is over the {MAX_REFERRER_MANIFEST_BYTES}-byte limit"
    return None


def _kind(desc: Descriptor) -> str:
    # cosign 3 lists its bundles in the fallback index under the empty config's media type (or
    # none); kernelbake and the referrers API under the bundle's own.
    return "bundle" if desc.artifact_type in formats.BUNDLE_MEDIA_TYPES else "untyped"


_HALF = MAX_BUNDLES // 2
_BOUND = (
    f"not examined: only {MAX_BUNDLES} candidate bundles are (of each listed artifactType: "
    f"the oldest {_HALF} and the newest {_HALF})"
)


def _selected(entries: Sequence[Descriptor], prefer: Collection[str], tally: _Tally) -> list[Descriptor]:
    """The candidates to fetch, in the order to try them.

    Which are fetched depends on the listed artifactType and the position only, never on an
    annotation (anyone who pushes can copy one): of each artifactType, all of them up to
    ``MAX_BUNDLES``, else the oldest and the newest half of that. Junk of another artifactType
    than the signature's pushes nothing out, in any number and order. kernelbake and registries
    append to a listing (cosign 3 writes the fallback index in digest order), so junk listed
    after the signer last wrote, in any number, pushes nothing out either. The annotations only
    order what was selected (the caller's predicate first), so that verification is quick, not
    what is found."""
    kinds: dict[str, list[Descriptor]] = {}
    for d in entries:
        kinds.setdefault(_kind(d), []).append(d)
    out: list[Descriptor] = []
    for group in kinds.values():
        turns: list[Descriptor] = []
        oldest, newest = 0, len(group) - 1
        while oldest <= newest:  # oldest, newest, second oldest, …
            turns.append(group[oldest])
            if newest != oldest:
                turns.append(group[newest])
            oldest, newest = oldest + 1, newest - 1
        out += turns[:MAX_BUNDLES]
        for desc in turns[MAX_BUNDLES:]:
            tally.group("bound", f"bundle {desc.digest[:19]}", _BOUND)

    def hint(d: Descriptor) -> tuple[bool, bool]:
        return d.annotations.get(formats.ANN_BUNDLE_PREDICATE) not in prefer, _kind(d) != "bundle"

    return sorted(out, key=hint)


def _read_blob(
    client: RegistryClient, ref: Reference, layer: Descriptor, name: str, tally: _Tally
) -> bytes | None:
    if not is_digest(layer.digest):
        tally.item(name, f"malformed layer digest {_shown(layer.digest)}")
        return None
    if layer.size > MAX_ARTIFACT_BYTES:
        tally.item(name, f"{layer.size} bytes is over the {MAX_ARTIFACT_BYTES}-byte limit")
        return None
    try:
        return client.get_blob(ref, layer.digest, max_bytes=MAX_ARTIFACT_BYTES)
    except RegistryNotFound:
        tally.item(name, "listed, but its blob is gone")
    except RegistryProtocolError as exc:
        # The message names the blob (repository@digest) first; the name above says enough.
        tally.item(name, f"blob unreadable: {str(exc).partition(': ')[2] or exc}")
    return None


def _bundle(client: RegistryClient, ref: Reference, desc: Descriptor, tally: _Tally) -> Artifact | None:
    origin, name = f"{ref.name}@{desc.digest} (bundle)", f"bundle {desc.digest[:19]}"
    try:
        manifest = client.get_manifest(
            ref.with_digest(desc.digest), accept=(mt.OCI_MANIFEST,), max_bytes=MAX_REFERRER_MANIFEST_BYTES
        )
        layers = manifest.layers
        artifact_type = manifest.artifact_type
    except RegistryNotFound:
        tally.item(name, "listed, but the manifest is gone")
        return None
    except RegistryProtocolError as exc:
        tally.item(name, f"unreadable ({exc})")
        return None
    if artifact_type not in formats.BUNDLE_MEDIA_TYPES:
        tally.item(name, f"not a Sigstore bundle (artifactType {_shown(artifact_type)})")
        return None
    bundles = [layer for layer in layers if layer.media_type in formats.BUNDLE_MEDIA_TYPES]
    if len(bundles) != 1:
        tally.item(name, f"holds {len(bundles)} bundle layers, not one")
        return None
    data = _read_blob(client, ref, bundles[0], name, tally)
    return None if data is None else Artifact(Kind.BUNDLE, origin, data, name=name)


# A DER P-256 signature is at most 72 bytes, 96 in base64: a longer vouch is not decoded.
_MAX_VOUCH_SIGNATURE = 128
# Distinct vouch claims checked (signature and, for keyless, certificate checks) per listing. A
# listed entry that reaches a check is at least ~380 bytes (digest, media type, layer digest,
# a trusted key's hint or a certificate, a signature), so the client's 8 MiB listing bound holds
# at most ~22,000 of them: the cap is above that, never what stops a scan of a listing the client
# reads; it keeps the work bounded should the listing bound grow. Past it, a claim is not
# checked and its referrer is an ordinary candidate.
MAX_VOUCH_CLAIMS = 24576


class _Vouches:
    """Which listed referrers a trusted signer vouches for (``formats.ANN_VOUCH_*``), from the
    listing alone, nothing fetched: a trusted key's (one ECDSA check per distinct claim), or a
    certificate for a trusted keyless identity (one chain check per distinct certificate, one
    ECDSA check per distinct claim: ``keyless.VouchChecker``)."""

    def __init__(
        self,
        subject: str,
        keys: Sequence[PublicKey],
        identities: Sequence[Identity],
        trusted_root: str | None,
    ) -> None:
        self._subject = subject
        self._keys = {k.hint: k for k in keys}
        self._identities = identities
        self._trusted_root = trusted_root
        self._keyless: VouchChecker | None = None
        self._checked: dict[tuple[str, str, str], bool | None] = {}

    def check(self, desc: Descriptor) -> bool | None:
        """True: vouched by a trusted signer; False: claims a trusted signer's vouch that does
        not verify (kernelbake never writes one: junk); None: no vouch by a trusted signer."""
        ann = desc.annotations
        layer = ann.get(formats.ANN_VOUCH_LAYER)
        signature = ann.get(formats.ANN_VOUCH_SIGNATURE)
        if layer is None or signature is None:
            return None
        hint = ann.get(formats.ANN_VOUCH_KEY)
        certificate = ann.get(formats.ANN_VOUCH_CERTIFICATE)
        if hint is not None:
            if hint not in self._keys:
                return None
            claim = ("key", hint, layer + " " + signature)
        elif certificate is not None and self._identities and self._trusted_root is not None:
            claim = ("certificate", certificate, layer + " " + signature)
        else:
            return None
        if claim not in self._checked:
            if len(self._checked) >= MAX_VOUCH_CLAIMS:
                return None
            self._checked[claim] = self._verifies(claim[0], claim[1], layer, signature)
        return self._checked[claim]

    def _verifies(self, kind: str, signer: str, layer: str, signature: str) -> bool | None:
        if not is_digest(layer):
            return False
        payload = formats.vouch_payload(self._subject, layer)
        if kind == "certificate":
            assert self._trusted_root is not None
            if self._keyless is None:
                # Imported here: sigstore-python costs ~0.3 s to import, and only a listing
                # with a keyless vouch under a policy with identities needs it.
                from kernelbake.signing._internal.keyless import VouchChecker

                self._keyless = VouchChecker(self._identities, self._trusted_root)
            return self._keyless.check(signer, signature, payload)
        if len(signature) > _MAX_VOUCH_SIGNATURE:
            return False
        try:
            raw = base64.b64decode(signature, validate=True)
        except (binascii.Error, ValueError):
            return False
        return self._keys[signer].verifies(raw, payload)


def _vouched(
    client: RegistryClient, ref: Reference, descs: Sequence[Descriptor], tally: _Tally
) -> list[Artifact]:
    """The bundles that trusted signers vouch for, newest first, each layer once, read by the digest
    that was signed (content-addressed: no manifest to fetch, nothing a look-alike can swap)."""
    layers: dict[str, Descriptor] = {}
    for desc in reversed(descs):
        layer = desc.annotations[formats.ANN_VOUCH_LAYER]
        if layer in layers:
            # A copy (or a re-push) of a vouched referrer: the same bundle, read once.
            reason = f"vouches for the same bundle as {layers[layer].digest[:19]}, read once"
            tally.group("vouched again", f"referrer {desc.digest[:19]}", reason)
        else:
            layers[layer] = desc
    out = []
    for i, (layer, desc) in enumerate(layers.items()):
        name = f"bundle {desc.digest[:19]}"
        if i >= MAX_BUNDLES:
            reason = f"not examined: only {MAX_BUNDLES} vouched bundles are (newest first)"
            tally.group("vouched bound", name, reason)
            continue
        blob = Descriptor(media_type=formats.BUNDLE_V03, digest=layer, size=0)
        data = _read_blob(client, ref, blob, name, tally)
        if data is not None:
            out.append(Artifact(Kind.BUNDLE, f"{ref.name}@{desc.digest} (bundle)", data, name=name))
    return out


def _bundles(
    client: RegistryClient,
    ref: Reference,
    prefer: Collection[str],
    vouches: _Vouches,
    tally: _Tally,
) -> list[Artifact]:
    candidates, vouched = [], []
    listing = client.referrer_listing(ref)
    if listing.cut is not None:
        tally.item("referrers", f"{listing.cut}: the entries past the bound were not examined")
    if listing.malformed:
        tally.item("referrers", "listed entries that are no descriptor", count=listing.malformed)
    for desc in listing.entries:
        problem = _listing_problem(desc)
        if problem is not None:
            tally.group(problem[0], f"referrer {desc.digest[:19]}", problem[1])
            continue
        vouch = vouches.check(desc)
        if vouch is None:
            candidates.append(desc)
        elif vouch:
            vouched.append(desc)
        else:
            who = "key" if formats.ANN_VOUCH_KEY in desc.annotations else "identity's certificate"
            reason = f"its vouch by a trusted {who} does not verify for this digest (copied or forged)"
            tally.group(f"vouch {who}", f"referrer {desc.digest[:19]}", reason)
    found = _vouched(client, ref, vouched, tally)
    others = (_bundle(client, ref, desc, tally) for desc in _selected(candidates, prefer, tally))
    return [*found, *(a for a in others if a is not None)]


def _legacy(
    client: RegistryClient, ref: Reference, suffix: str, kind: Kind, media_type: str, tally: _Tally
) -> list[Artifact]:
    assert ref.digest is not None
    tag = formats.legacy_tag(ref.digest, suffix)
    try:
        manifest = client.get_manifest(
            ref.with_tag(tag), accept=mt.IMAGE_MANIFESTS, max_bytes=MAX_LEGACY_MANIFEST_BYTES
        )
        layers = manifest.layers
    except RegistryNotFound:
        return []
    except RegistryProtocolError as exc:
        tally.item(f"{suffix} tag", f"unreadable ({exc})")
        return []
    out, examined = [], 0
    for i, layer in reversed(list(enumerate(layers))):  # newest first: cosign appends to the tag
        origin, name = f"{ref.name}:{tag} layer {i}", f"{suffix} layer {i}"
        if layer.media_type != media_type:
            reason = f"not a signature layer (mediaType {_shown(layer.media_type)})"
            tally.group(f"{tag} media-type", name, reason)
            continue
        if examined >= MAX_LEGACY_LAYERS:
            reason = f"not examined: only the newest {MAX_LEGACY_LAYERS} layers are"
            tally.group(f"{tag} bound", name, reason)
            continue
        examined += 1
        if (data := _read_blob(client, ref, layer, name, tally)) is not None:
            out.append(Artifact(kind, origin, data, layer.annotations, name=name))
    return out


def find_artifacts(
    client: RegistryClient,
    ref: Reference,
    *,
    prefer: Collection[str] = (),
    vouchers: Sequence[PublicKey] = (),
    identities: Sequence[Identity] = (),
    trusted_root: str | None = None,
) -> Found:
    """Bundles (referrers API or fallback tag) and legacy ``.sig``/``.att`` layers of ``ref.digest``,
    and what was passed over. Bundles that a key in ``vouchers``, or a certificate for one of
    ``identities`` from ``trusted_root``'s CA, vouches for come first (all of them, however many
    other referrers there are), then the others: those whose predicate-type annotation is in
    ``prefer`` first, within ``MAX_BUNDLES``."""
    assert ref.digest is not None
    tally = _Tally()
    vouches = _Vouches(ref.digest, vouchers, identities, trusted_root)
    artifacts = [
        *_bundles(client, ref, prefer, vouches, tally),
        *_legacy(client, ref, formats.SIG_SUFFIX, Kind.LEGACY_SIGNATURE, formats.SIMPLE_SIGNING, tally),
        *_legacy(client, ref, formats.ATT_SUFFIX, Kind.LEGACY_ATTESTATION, formats.DSSE_ENVELOPE, tally),
    ]
    return Found(tuple(artifacts), tally.result())


def describe_skipped(skipped: Sequence[Skipped], *, what: str = "attached", shown: int = 3) -> str:
    """``skipped N attached artifacts: origin: reason; 64 times: reason (first origin); and M more``:
    alike reasons merged, the first ``shown`` of them, then a count, so that junk cannot make a
    message long."""
    merged: dict[str, Skipped] = {}
    for s in skipped:
        first = merged.get(s.reason)
        merged[s.reason] = s if first is None else dataclasses.replace(first, count=first.count + s.count)
    groups = list(merged.values())
    parts = [
        f"{s.origin}: {s.reason}" if s.count == 1 else f"{s.count} times: {s.reason} (first {s.origin})"
        for s in groups[:shown]
    ]
    rest = sum(s.count for s in groups[shown:])
    if rest:
        parts.append(f"and {rest} more")
    total = sum(s.count for s in groups)
    return f"skipped {total} {what} artifact{'s' * (total != 1)}: {'; '.join(parts)}"
