"""The admission policy file (YAML), validated when it is loaded: one-line errors naming
``file:line: field`` (``kernelbake.validate``), exit code 2.

The ``verify:`` section is the signing policy (``kernelbake.signing.policy``) verbatim; this
module only insists that it is there, and ``verifying.build_verifier`` parses it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernelbake.admission.references import InvalidReference, matches, normalise_pattern
from kernelbake.errors import BadInput
from kernelbake.oci.hosts import InvalidHost, canonical_host_pattern
from kernelbake.validate import Source, load_yaml, quoted


class PolicyError(BadInput):
    """The policy file is malformed; the message names file:line: field."""


class Mode(enum.Enum):
    ENFORCE = "enforce"
    # Admit everything, but say in ``response.warnings`` what enforce mode would have denied.
    WARN = "warn"


class GpuMatch(enum.Enum):
    # Every way the pod can schedule must pin GPU products whose device name is the baked one
    # (vLLM's compile hash includes it: anything else starts cold).
    DEVICE = "device"
    # Family / compute capability pins are enough when they imply the baked arch; a different
    # device name is only a warning (the kernels run, the caches are recompiled).
    ARCH = "arch"


class OnRegistryError(enum.Enum):
    DENY = "deny"
    # Admit, unpinned and unverified, when the registry cannot be reached: an outage of the
    # registry then turns off the check. Named unsafe on purpose.
    UNSAFE_ALLOW = "unsafe-allow"


class UnlistedRegistries(enum.Enum):
    # Images outside ``images`` pass untouched, wherever they come from (the default: a policy
    # governs its repositories and nothing else).
    ALLOW = "allow"
    # Only registries the policy names are pulled from: hosts in ``images`` patterns (their
    # other repositories pass untouched) and ``unverified_registries``. The answer to a name
    # that reaches a governed registry through an alias no name check can see (/etc/hosts, DNS).
    DENY = "deny"


_TOP = (
    "mode",
    "images",
    "unlisted_registries",
    "unverified_registries",
    "verify",
    "gpu",
    "registry_errors",
    "deadline_seconds",
    "cache",
    "concurrency",
    "registry_concurrency",
    "registry_queue",
)
_CACHE = ("ttl_seconds", "tag_ttl_seconds", "rejected_ttl_seconds", "max_entries")
_GPU = ("match",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CachePolicy:
    # Verified digests are immutable content, so their verdict can live long; the TTL bounds
    # how late a revoked key or changed policy takes effect.
    ttl_seconds: float = 600.0
    # Tags move: how long a tag → digest resolution is reused. 0 resolves on every review.
    tag_ttl_seconds: float = 30.0
    # Rejections are kept briefly so a crash-looping controller does not hammer the registry,
    # and briefly enough that signing an image and re-applying works at once.
    rejected_ttl_seconds: float = 5.0
    max_entries: int = 10_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdmissionPolicy:
    source: str
    images: tuple[str, ...]
    verify: Mapping[str, Any]
    mode: Mode = Mode.ENFORCE
    unlisted_registries: UnlistedRegistries = UnlistedRegistries.ALLOW
    # Registry host patterns whose images outside ``images`` pass unverified (deny mode only).
    unverified_registries: tuple[str, ...] = ()
    gpu_match: GpuMatch = GpuMatch.DEVICE
    registry_errors: OnRegistryError = OnRegistryError.DENY
    # Below the API server's default webhook timeout (10 s) so a slow registry yields a
    # denial with a reason, not a timeout the user cannot read.
    deadline_seconds: float = 8.0
    cache: CachePolicy = CachePolicy()
    # Verifications at once, all registries together …
    concurrency: int = 8
    # … of which one registry (host[:port]) may use at most this many (default: half), so a
    # slow or flooded registry leaves the others their share …
    registry_concurrency: int = 4
    # … and keep at most this many waiting; beyond, a review is "could not ask" (503) at once.
    registry_queue: int = 64
    # Where ``verify`` came from, so its errors (found when it is parsed) name file:line too.
    verify_source: Source | None = dataclasses.field(default=None, compare=False, repr=False)

    def governs(self, name: str) -> bool:
        """Whether the normalised ``host/repository`` is one this policy checks."""
        return any(matches(name, p) for p in self.images)

    def listed_registries(self) -> tuple[str, ...] | None:
        """The registry host patterns images may come from, or None when any may
        (``unlisted_registries: allow``)."""
        if self.unlisted_registries is UnlistedRegistries.ALLOW:
            return None
        hosts = tuple(p.partition("/")[0] for p in self.images)
        return tuple(dict.fromkeys(hosts + self.unverified_registries))

    @classmethod
    def from_mapping(cls, data: Any, *, source: str | Source) -> AdmissionPolicy:
        src = (source if isinstance(source, Source) else Source(source)).with_error(PolicyError)
        data = src.mapping(data, "", _TOP)
        images = _images(src, data.get("images"))
        unlisted = src.enum(
            UnlistedRegistries,
            data.get("unlisted_registries", UnlistedRegistries.ALLOW.value),
            "unlisted_registries",
        )
        unverified = _registries(src, data.get("unverified_registries"), unlisted)
        verify = data.get("verify")
        if not isinstance(verify, Mapping) or not verify:
            raise src.error("verify", "required: the trusted identities or keys (see deploy/policy.yaml)")
        gpu = src.mapping(data.get("gpu", {}), "gpu", _GPU)
        cache = src.mapping(data.get("cache", {}), "cache", _CACHE)
        defaults = CachePolicy()
        cache_policy = CachePolicy(
            ttl_seconds=src.seconds(cache.get("ttl_seconds", defaults.ttl_seconds), "cache.ttl_seconds"),
            tag_ttl_seconds=src.seconds(
                cache.get("tag_ttl_seconds", defaults.tag_ttl_seconds), "cache.tag_ttl_seconds"
            ),
            rejected_ttl_seconds=src.seconds(
                cache.get("rejected_ttl_seconds", defaults.rejected_ttl_seconds), "cache.rejected_ttl_seconds"
            ),
            max_entries=src.positive_int(cache.get("max_entries", defaults.max_entries), "cache.max_entries"),
        )
        deadline = src.seconds(data.get("deadline_seconds", cls.deadline_seconds), "deadline_seconds")
        if not 0 < deadline <= 29:
            raise src.error(
                "deadline_seconds",
                f"{deadline} must be above 0 and below the webhook's timeoutSeconds (at most 30)",
            )
        concurrency = src.positive_int(data.get("concurrency", cls.concurrency), "concurrency")
        registry_concurrency = src.positive_int(
            data.get("registry_concurrency", max(1, concurrency // 2)), "registry_concurrency"
        )
        if registry_concurrency > concurrency:
            raise src.error(
                "registry_concurrency",
                f"{registry_concurrency} is more than concurrency ({concurrency}), "
                "the verifications at once for all registries together",
            )
        # 0 is allowed: no queue, a registry whose share is busy is "saturated" at once.
        registry_queue = src.non_negative_int(
            data.get("registry_queue", cls.registry_queue), "registry_queue"
        )
        return cls(
            source=src.name,
            images=images,
            verify=verify,
            mode=src.enum(Mode, data.get("mode", Mode.ENFORCE.value), "mode"),
            unlisted_registries=unlisted,
            unverified_registries=unverified,
            gpu_match=src.enum(GpuMatch, gpu.get("match", GpuMatch.DEVICE.value), "gpu.match"),
            registry_errors=src.enum(
                OnRegistryError, data.get("registry_errors", OnRegistryError.DENY.value), "registry_errors"
            ),
            deadline_seconds=deadline,
            cache=cache_policy,
            concurrency=concurrency,
            registry_concurrency=registry_concurrency,
            registry_queue=registry_queue,
            verify_source=src.child("verify"),
        )


def load_policy_document(path: str | Path) -> tuple[Any, Source]:
    """The parsed YAML of a policy file and where it came from, for messages."""
    return load_yaml(path, what="policy", error_type=PolicyError)


def load_admission_policy(path: str | Path) -> AdmissionPolicy:
    data, source = load_policy_document(path)
    return AdmissionPolicy.from_mapping(data, source=source)


def _images(src: Source, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise src.error(
            "images",
            "required: a list of repository patterns this policy governs, "
            "e.g. ['registry.example.com/kernelbake/**']",
        )
    patterns = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise src.error(f"images[{i}]", f"expected a repository pattern string, got {quoted(item)}")
        if "@" in item or (":" in item.rpartition("/")[2] and "/" in item):
            raise src.error(
                f"images[{i}]",
                f"{quoted(item)} names a tag or digest; patterns match repositories "
                "(use host/path/** for everything under a path)",
            )
        try:
            patterns.append(normalise_pattern(item.strip()))
        except InvalidReference as exc:
            raise src.error(f"images[{i}]", str(exc)) from None
    return tuple(patterns)


def _registries(src: Source, value: Any, unlisted: UnlistedRegistries) -> tuple[str, ...]:
    if value is None:
        return ()
    if unlisted is UnlistedRegistries.ALLOW:
        # A list that changes nothing would read as a restriction that is not there.
        raise src.error(
            "unverified_registries",
            "is read only with unlisted_registries: deny (with allow, every registry is admitted)",
        )
    hosts = []
    for i, item in enumerate(src.optional_list(value, "unverified_registries")):
        field = f"unverified_registries[{i}]"
        if not isinstance(item, str) or not item.strip():
            raise src.error(field, f"expected a registry host[:port] (globs allowed), got {quoted(item)}")
        if "/" in item or "@" in item:
            raise src.error(
                field,
                f"{quoted(item)} is not a registry host[:port]; this list names whole registries "
                "(repositories to verify go under images)",
            )
        try:
            hosts.append(canonical_host_pattern(item.strip()))
        except InvalidHost as exc:
            raise src.error(field, str(exc)) from None
    return tuple(hosts)
