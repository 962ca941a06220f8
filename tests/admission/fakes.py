"""Injected verifiers for unit tests of the webhook core (integration tests use the real one)."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kernelbake.admission.gateway import Gateway, ImageRejected
from kernelbake.admission.policy import AdmissionPolicy
from kernelbake.admission.references import parse_reference
from kernelbake.admission.service import Admitter
from kernelbake.admission.subject import Image, VerifiedIndex
from kernelbake.contract.key import CacheKey
from kernelbake.contract.variants import Variant
from kernelbake.oci import RegistryUnavailable
from kernelbake.oci.types import OCI_MANIFEST

REGISTRY = "registry.example.com"
REPO = f"{REGISTRY}/kernelbake/qwen3-0.6b"
TRUST = {
    "identities": [{"issuer": "https://token.actions.githubusercontent.com", "subject": "ci@example.com"}]
}


def digest_of(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class FakeVerified:
    reference: str
    repository: str
    digest: str
    key: CacheKey
    manifest_digest: str
    signer: str
    attestation: Mapping[str, Any]


class FakeVerifier:
    """Knows a set of tags → (digest, key); everything else is unsigned. Counts calls, can be
    told that the registry is down, and can hold calls until released."""

    def __init__(self) -> None:
        self.images: dict[str, tuple[str, CacheKey]] = {}
        self.indexes: dict[str, tuple[str, tuple[Variant, ...]]] = {}
        self.wrong_signer: set[str] = set()
        self.down = False
        self.calls: list[str] = []
        self.gate: threading.Event | None = None
        self._lock = threading.Lock()

    def add(self, tag_ref: str, key: CacheKey) -> str:
        digest = digest_of(tag_ref)
        self.images[tag_ref] = (digest, key)
        return digest

    def add_index(self, tag_ref: str, variants: Mapping[str, CacheKey]) -> str:
        """A GPU index at ``tag_ref`` listing the images ``variants`` names (already added) under
        the keys given (which may lie about them); returns its digest."""
        listed = tuple(
            Variant(key=key, digest=self.images[image][0], size=1234, media_type=OCI_MANIFEST)
            for image, key in variants.items()
        )
        digest = digest_of(f"index {tag_ref}")
        self.indexes[tag_ref] = (digest, listed)
        return digest

    def __call__(self, reference: str) -> Image | VerifiedIndex:
        with self._lock:
            self.calls.append(reference)
        if self.gate is not None:
            self.gate.wait(30)
        if self.down:
            raise RegistryUnavailable(f"registry {REGISTRY} did not answer: connection refused")
        ref = parse_reference(reference)
        for tag_ref, (digest, variants) in self.indexes.items():
            known = parse_reference(tag_ref)
            if known.name == ref.name and (
                ref.digest == digest or (ref.digest is None and ref.tag == known.tag)
            ):
                return VerifiedIndex(digest, "ci@example.com", variants)
        for tag_ref, (digest, key) in self.images.items():
            known = parse_reference(tag_ref)
            if known.name == ref.name and (
                ref.digest == digest or (ref.digest is None and ref.tag == known.tag)
            ):
                if tag_ref in self.wrong_signer:
                    raise ImageRejected(
                        f"{ref.name}@{digest} is signed by mallory@example.com, not a trusted identity "
                        "(trusted: ci@example.com from https://token.actions.githubusercontent.com)"
                    )
                return Image(FakeVerified(reference, ref.name, digest, key, digest, "ci@example.com", {}))
        raise ImageRejected(f"{reference} has no signature from a trusted identity")


def make_policy(**overrides: Any) -> AdmissionPolicy:
    data: dict[str, Any] = {"images": [f"{REGISTRY}/kernelbake/**"], "verify": TRUST}
    data.update(overrides)
    return AdmissionPolicy.from_mapping(data, source="policy.yaml")


def make_admitter(
    verifier: Callable[[str], Any], policy: AdmissionPolicy | None = None, **gateway_kw: Any
) -> Admitter:
    policy = policy or make_policy()
    gateway = Gateway(
        verifier,
        cache=policy.cache,
        workers=policy.concurrency,
        registry_workers=policy.registry_concurrency,
        registry_queue=policy.registry_queue,
        **gateway_kw,
    )
    return Admitter(policy, gateway)
