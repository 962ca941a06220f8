"""The real verifier: ``kernelbake.signing.verify.verify_image`` bound to the policy's
``verify:`` section, with its failures sorted into what admission distinguishes.

- ``RegistryUnavailable`` (timeout, 5xx, refused credentials): "could not ask", the case
  ``registry_errors`` decides;
- everything else, including a 404 for the image, is a rejection: the registry answered and the
  image is not there or not acceptable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kernelbake import oci
from kernelbake.admission.gateway import Gateway, ImageRejected, RegistryUnavailable
from kernelbake.admission.policy import AdmissionPolicy
from kernelbake.errors import KernelbakeError
from kernelbake.settings import Settings
from kernelbake.signing import errors as signing_errors
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.verify import VerifiedImage, verify_image

_T = TypeVar("_T")


def verify_policy(policy: AdmissionPolicy) -> VerifyPolicy:
    """Parse the ``verify:`` section now, so a bad one fails at load with file:field."""
    return VerifyPolicy.from_mapping(
        policy.verify, source=f"{policy.source}:verify", base_dir=Path(policy.source).parent
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
    ) -> None:
        self.trust = trust
        self._factory = client_factory or (lambda: oci.RegistryClient(settings, timeout=timeout))
        self._local = threading.local()

    def _client(self) -> oci.RegistryClient:
        client: oci.RegistryClient | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._factory()
        return client

    def __call__(self, reference: str) -> VerifiedImage:
        return _sorted(lambda: verify_image(reference, self.trust, client=self._client()))

    def resolve(self, reference: str) -> str:
        """The digest a tag points to now (one manifest GET), for the gateway's tag cache."""
        return _sorted(lambda: self._client().resolve(oci.parse_reference(reference)))


def _sorted(call: Callable[[], _T]) -> _T:
    try:
        return call()
    except (signing_errors.ImageNotFound, oci.RegistryNotFound) as exc:
        raise ImageRejected(f"image not found: {exc}") from None
    except (
        signing_errors.RegistryUnavailable,
        oci.RegistryUnreachable,
        oci.RegistryServerError,
        oci.RegistryDenied,
    ) as exc:
        raise RegistryUnavailable(str(exc)) from None
    except KernelbakeError as exc:
        raise ImageRejected(str(exc)) from None


def build_gateway(policy: AdmissionPolicy, *, settings: Settings | None = None) -> Gateway:
    verifier = SignedImageVerifier(verify_policy(policy), settings=settings, timeout=policy.deadline_seconds)
    return Gateway(
        verifier,
        cache=policy.cache,
        workers=policy.concurrency,
        registry_workers=policy.registry_concurrency,
        registry_queue=policy.registry_queue,
        resolve=verifier.resolve,
    )
