"""The admission policy file (YAML), validated when it is loaded: one-line errors naming
``file:field``, exit code 2.

The ``verify:`` section is the signing policy (``kernelbake.signing.policy``) verbatim; this
module only insists that it is there, and ``verifying.build_verifier`` parses it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kernelbake._suggest import did_you_mean
from kernelbake.admission.references import matches, normalise_pattern
from kernelbake.errors import BadInput


class PolicyError(BadInput):
    """The policy file is malformed; the message names file:field."""


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


_E = TypeVar("_E", bound=enum.Enum)

_TOP = (
    "mode",
    "images",
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

    def governs(self, name: str) -> bool:
        """Whether the normalised ``host/repository`` is one this policy checks."""
        return any(matches(name, p) for p in self.images)

    @classmethod
    def from_mapping(cls, data: Any, *, source: str) -> AdmissionPolicy:
        if not isinstance(data, Mapping):
            raise PolicyError(f"{source}: a policy is a mapping, got {type(data).__name__}")
        _no_unknown(data, _TOP, source, "")
        images = _images(data.get("images"), f"{source}:images")
        verify = data.get("verify")
        if not isinstance(verify, Mapping) or not verify:
            raise PolicyError(
                f"{source}:verify: required: the trusted identities or keys (see deploy/policy.yaml)"
            )
        gpu = data.get("gpu", {})
        if not isinstance(gpu, Mapping):
            raise PolicyError(f"{source}:gpu: expected a mapping")
        _no_unknown(gpu, _GPU, source, "gpu.")
        cache = data.get("cache", {})
        if not isinstance(cache, Mapping):
            raise PolicyError(f"{source}:cache: expected a mapping")
        _no_unknown(cache, _CACHE, source, "cache.")
        defaults = CachePolicy()
        cache_policy = CachePolicy(
            ttl_seconds=_seconds(cache, "ttl_seconds", defaults.ttl_seconds, source, "cache."),
            tag_ttl_seconds=_seconds(cache, "tag_ttl_seconds", defaults.tag_ttl_seconds, source, "cache."),
            rejected_ttl_seconds=_seconds(
                cache, "rejected_ttl_seconds", defaults.rejected_ttl_seconds, source, "cache."
            ),
            max_entries=_count(cache, "max_entries", defaults.max_entries, source, "cache."),
        )
        deadline = _seconds(data, "deadline_seconds", cls.deadline_seconds, source, "")
        if not 0 < deadline <= 29:
            raise PolicyError(
                f"{source}:deadline_seconds: {deadline} must be above 0 and below the webhook's "
                "timeoutSeconds (at most 30)"
            )
        concurrency = _count(data, "concurrency", cls.concurrency, source, "")
        registry_concurrency = _count(data, "registry_concurrency", max(1, concurrency // 2), source, "")
        if registry_concurrency > concurrency:
            raise PolicyError(
                f"{source}:registry_concurrency: {registry_concurrency} is more than concurrency "
                f"({concurrency}), the verifications at once for all registries together"
            )
        return cls(
            source=source,
            images=images,
            verify=verify,
            mode=_enum(Mode, data.get("mode", Mode.ENFORCE.value), f"{source}:mode"),
            gpu_match=_enum(GpuMatch, gpu.get("match", GpuMatch.DEVICE.value), f"{source}:gpu.match"),
            registry_errors=_enum(
                OnRegistryError,
                data.get("registry_errors", OnRegistryError.DENY.value),
                f"{source}:registry_errors",
            ),
            deadline_seconds=deadline,
            cache=cache_policy,
            concurrency=concurrency,
            registry_concurrency=registry_concurrency,
            registry_queue=_count(data, "registry_queue", cls.registry_queue, source, "", minimum=0),
        )


def load_policy_document(path: str | Path) -> tuple[Any, str]:
    """The parsed YAML of a policy file and its name for messages."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"{source}: cannot read the policy: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PolicyError(f"{source}: the policy is not UTF-8 text") from None
    try:
        return yaml.safe_load(text), source
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise PolicyError(f"{source}{where}: {problem}") from None


def load_admission_policy(path: str | Path) -> AdmissionPolicy:
    data, source = load_policy_document(path)
    return AdmissionPolicy.from_mapping(data, source=source)


def _no_unknown(data: Mapping[Any, Any], known: tuple[str, ...], source: str, prefix: str) -> None:
    for name in data:
        if name not in known:
            raise PolicyError(f"{source}:{prefix}{name}: unknown field{did_you_mean(str(name), known)}")


def _images(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise PolicyError(
            f"{where}: required: a list of repository patterns this policy governs, "
            "e.g. ['registry.example.com/kernelbake/**']"
        )
    patterns = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise PolicyError(f"{where}[{i}]: expected a repository pattern string, got {item!r}")
        if "@" in item or (":" in item.rpartition("/")[2] and "/" in item):
            raise PolicyError(
                f"{where}[{i}]: {item!r} names a tag or digest; patterns match repositories "
                "(use host/path/** for everything under a path)"
            )
        patterns.append(normalise_pattern(item.strip()))
    return tuple(patterns)


def _enum(kind: type[_E], value: Any, where: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        choices = [str(m.value) for m in kind]
        raise PolicyError(f"{where}: {value!r} is not one of {', '.join(choices)}") from None


def _seconds(data: Mapping[str, Any], name: str, default: float, source: str, prefix: str) -> float:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise PolicyError(
            f"{source}:{prefix}{name}: expected a non-negative number of seconds, got {value!r}"
        )
    return float(value)


def _count(
    data: Mapping[str, Any], name: str, default: int, source: str, prefix: str, *, minimum: int = 1
) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise PolicyError(f"{source}:{prefix}{name}: expected {expected}, got {value!r}")
    return value
