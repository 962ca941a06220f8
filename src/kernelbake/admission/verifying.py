"""The real verifier: ``kernelbake.signing.verify.verify_image`` bound to the policy's
``verify:`` section, with its failures sorted into what admission distinguishes.

- ``kernelbake.oci.RegistryUnavailable`` (timeout, 5xx, refused credentials), whether the
  registry client or verification raised it: "could not ask", the case ``registry_errors``
  decides, passed through as it is;
- everything else, including a 404 for the image, is a rejection: the registry answered and the
  image is not there or not acceptable.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from kernelbake import oci
from kernelbake.admission.delta_reads import DeltaReads
from kernelbake.admission.gateway import Gateway, ImageRejected
from kernelbake.admission.large_bodies import BodyBudget
from kernelbake.admission.pod_facts import PodFacts
from kernelbake.admission.policy import AdmissionPolicy
from kernelbake.admission.subject import CacheArtifact, Delta, Image, Snapshot, Subject, VerifiedIndex
from kernelbake.contract.artifact import InvalidArtifact
from kernelbake.contract.key import CacheKey
from kernelbake.contract.snapshot import SnapshotKey
from kernelbake.errors import KernelbakeError
from kernelbake.fleet import read_index
from kernelbake.settings import Settings
from kernelbake.signing.delta import is_delta, read_delta
from kernelbake.signing.errors import LabelMismatch, MissingAttestation, NotKernelbakeImage
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.snapshot import VerifiedSnapshot, is_snapshot, read_snapshot
from kernelbake.signing.verify import VerifiedImage, verify_image, verify_signature

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedSnapshotVolume:
    """A verified snapshot artifact as admission judges it (``subject.SnapshotLike``: its ``key``
    is the cache key of the image it was taken from)."""

    reference: str
    digest: str
    key: CacheKey
    signer: str
    base_digest: str  # the image it was taken from
    manifest_digest: str  # snapshot.json's sha256: what $KERNELBAKE_SNAPSHOT_DIGEST pins
    snapshot_key: SnapshotKey
    environment: Mapping[str, str] | None


def snapshot_volume(verified: VerifiedSnapshot) -> VerifiedSnapshotVolume:
    return VerifiedSnapshotVolume(
        reference=verified.reference,
        digest=verified.digest,
        key=verified.key.cache_key,
        signer=verified.signer,
        base_digest=verified.base_digest,
        manifest_digest=verified.manifest_digest,
        snapshot_key=verified.key,
        environment=verified.environment,
    )


def verify_policy(policy: AdmissionPolicy) -> VerifyPolicy:
    """Parse the ``verify:`` section now, so a bad one fails at load with file:line: field."""
    return VerifyPolicy.from_mapping(
        policy.verify,
        source=policy.verify_source or f"{policy.source}: verify",
        base_dir=Path(policy.source).parent,
    )


class SignedImageVerifier:
    """Callable ``reference -> VerifiedImage``; one registry client per worker thread (a
    ``requests.Session`` is not meant to be shared across threads)."""

    def __init__(
        self,
        trust: VerifyPolicy,
        *,
        settings: Settings | None = None,
        timeout: float = 10.0,
        client_factory: Callable[[], oci.RegistryClient] | None = None,
        delta_reads: DeltaReads | None = None,
    ) -> None:
        self.trust = trust
        # One verification (all its registry calls) ends within this, whatever the registry does.
        self.deadline = timeout
        # One read of each delta.json for every name it is copied under, a bounded number at once.
        self.delta_reads = delta_reads or DeltaReads(seconds=timeout)
        self._factory = client_factory or (lambda: oci.RegistryClient(settings, timeout=timeout))
        self._local = threading.local()

    def _client(self) -> oci.RegistryClient:
        client: oci.RegistryClient | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._factory()
        return client

    def __call__(self, reference: str) -> Subject | VerifiedIndex:
        client = self._client()
        with client.deadline(self.deadline, "verification deadline"):
            return _sorted(lambda: self._verify(reference, client))

    def _verify(self, reference: str, client: oci.RegistryClient) -> Subject | VerifiedIndex:
        try:
            return _kind(verify_image(reference, self.trust, client=client))
        except (InvalidArtifact, LabelMismatch, MissingAttestation):
            # A cache delta or a process snapshot fails here (its labels name no image or cache
            # artifact; its attestation is its own kind's): verified as what it is, then judged
            # against the pod's image (rules.delta, rules.snapshot_restore). Anything else
            # stays refused. One more GET per kind, on failures only.
            if is_delta(client, reference):
                return Delta(read_delta(client, reference, self.trust, parse=self.delta_reads))
            if is_snapshot(client, reference):
                return Snapshot(snapshot_volume(read_snapshot(client, reference, self.trust)))
            raise
        except NotKernelbakeImage:
            # Not one image: a model's GPU index is verified by its signature, and the variant a
            # pod is sent to on its own (the images' path stays as it was: no extra request).
            index = read_index(reference, client=client)
            if index is None:
                raise
        signed = verify_signature(client, index.ref, self.trust)
        return VerifiedIndex(signed.digest, signed.signer, index.variants)

    def resolve(self, reference: str) -> str:
        """The digest a tag points to now (one manifest GET), for the gateway's tag cache."""
        client = self._client()
        with client.deadline(self.deadline, "verification deadline"):
            return _sorted(lambda: client.resolve(oci.parse_reference(reference)))


def _kind(verified: VerifiedImage) -> Image | CacheArtifact:
    """A verified image, or a cache artifact when its labels carried an artifact's facts."""
    if verified.artifact is None:
        return Image(verified)
    return CacheArtifact(verified, verified.artifact)


def _sorted(call: Callable[[], _T]) -> _T:
    try:
        return call()
    except oci.RegistryNotFound as exc:  # signing's ImageNotFound is one
        raise ImageRejected(f"image not found: {exc}") from None
    except oci.RegistryUnavailable:
        raise
    except KernelbakeError as exc:
        raise ImageRejected(str(exc)) from None


def build_gateway(
    policy: AdmissionPolicy,
    *,
    settings: Settings | None = None,
    delta_budget: BodyBudget | None = None,
    delta_facts: PodFacts | None = None,
) -> Gateway:
    """``delta_budget``: the bytes of delta.json the pod reads at once, and ``delta_facts``:
    what they said, both shared by the workers when the parent made them before forking
    (default: this process's own budget, and nothing shared)."""
    # A verification gives up a little before the review's deadline, so that the answer carries
    # the registry's reason (which registry, which call) instead of "did not finish". It also
    # gives the verification's thread back to its registry's lane by then.
    seconds = policy.deadline_seconds * 0.9
    verifier = SignedImageVerifier(
        verify_policy(policy),
        settings=settings,
        timeout=seconds,
        delta_reads=DeltaReads(delta_budget, seconds=seconds, pod=delta_facts),
    )
    return Gateway(
        verifier,
        cache=policy.cache,
        workers=policy.concurrency,
        registry_workers=policy.registry_concurrency,
        registry_queue=policy.registry_queue,
        resolve=verifier.resolve,
    )
