"""OCI registry access: references, manifests as exact bytes, blobs, referrers."""

from kernelbake.oci.client import PushResult, RegistryClient, base_url, fallback_tag
from kernelbake.oci.errors import (
    DeadlineExceeded,
    RegistryDenied,
    RegistryNotFound,
    RegistryProtocolError,
    RegistryServerError,
    RegistryUnavailable,
    RegistryUnreachable,
)
from kernelbake.oci.reference import InvalidReference, Reference, parse_reference
from kernelbake.oci.types import Descriptor, Manifest

__all__ = [
    "DeadlineExceeded",
    "Descriptor",
    "InvalidReference",
    "Manifest",
    "PushResult",
    "Reference",
    "RegistryClient",
    "RegistryDenied",
    "RegistryNotFound",
    "RegistryProtocolError",
    "RegistryServerError",
    "RegistryUnavailable",
    "RegistryUnreachable",
    "base_url",
    "fallback_tag",
    "parse_reference",
]
