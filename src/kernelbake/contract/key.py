"""The compatibility key: every fact that decides whether a baked kernel cache is reusable.

One immutable value type, like ``packaging.tags.Tag``: ``str(key)`` is the canonical form,
``parse_key(str(key)) == key``, and the same object yields the image tag, the OCI labels,
the attestation predicate, the runtime preflight verdict and the admission check.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from kernelbake.contract.canonical import Canonical
from kernelbake.errors import BadInput

KEY_SCHEMA = "kb1"
LABEL_NS = "dev.kernelbake"
LABEL_KEY = f"{LABEL_NS}.key"
LABEL_DIGEST = f"{LABEL_NS}.key.digest"
NONE = "none"

# Characters left readable in the canonical string; everything else is percent-encoded so
# that ';' and '=' stay unambiguous separators and the string survives shells and labels.
_SAFE = "-._~/:+@"
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class Engine(enum.Enum):
    VLLM = "vllm"
    TORCH = "torch"


class InvalidKey(BadInput, ValueError):
    """A key string or label set that does not parse; quotes the offending input."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheKey(Canonical):
    """Fields are the wire strings (normalised); ``field_order`` is the canonical order
    (``str(key)``, ``as_dict``, ``digest``: ``contract.canonical``)."""

    PREFIX = KEY_SCHEMA
    SAFE = _SAFE

    engine: Engine
    engine_version: str
    torch: str
    triton: str
    cuda: str
    flashinfer: str
    python: str
    arch: str
    device: str
    driver_floor: str
    model: str
    revision: str
    model_path: str
    dtype: str
    quantization: str
    tp: int
    pp: int
    ep: int
    max_model_len: int
    max_num_batched_tokens: int
    compilation: str
    engine_env: str
    kernelbake: str

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int":
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise InvalidKey(f"key field {f.name}={value!r} must be a non-negative integer")
            elif f.name != "engine" and (not isinstance(value, str) or not value):
                raise InvalidKey(f"key field {f.name}={value!r} must be a non-empty string")
        if not isinstance(self.engine, Engine):
            raise InvalidKey(f"key field engine={self.engine!r} must be an Engine")
        # Case matters in the device name (vLLM hashes it verbatim) and in model ids and
        # paths; the rest are normalised so that equal meaning gives equal strings.
        for name in ("dtype", "quantization", "arch", "cuda", "triton", "flashinfer"):
            object.__setattr__(self, name, getattr(self, name).lower())
        if not self.model_path.startswith("/"):
            raise InvalidKey(f"key field model_path={self.model_path!r} must be an absolute path")

    @property
    def short_digest(self) -> str:
        return self.digest.removeprefix("sha256:")[:12]

    def replace(self, **changes: Any) -> CacheKey:
        return dataclasses.replace(self, **changes)

    # -- projections ------------------------------------------------------------------

    def tag(self, gpu: str) -> str:
        """Image tag, e.g. ``vllm0.26.0-cu130-sm90a-h100-1a2b3c4d`` (OCI tag grammar, ≤128 chars)."""
        cuda = "cpu" if self.cuda == NONE else "cu" + self.cuda.replace(".", "")
        arch = self.arch.replace("sm_", "sm")
        raw = f"{self.engine.value}{self.engine_version}-{cuda}-{arch}-{gpu}-{self.short_digest[:8]}"
        return _TAG_UNSAFE.sub("-", raw)[:128]

    def labels(self) -> dict[str, str]:
        """Our namespace of OCI labels: the canonical key, its digest, and one label per field."""
        labels = {LABEL_KEY: str(self), LABEL_DIGEST: self.digest}
        for name, value in self.as_dict().items():
            labels[f"{LABEL_NS}.{name.replace('_', '-')}"] = value
        return labels


def parse_key(text: str) -> CacheKey:
    """Inverse of ``str(CacheKey)``; raises ``InvalidKey`` quoting the input."""
    prefix, sep, body = text.strip().partition(":")
    if not sep or prefix != KEY_SCHEMA:
        raise InvalidKey(f"not a kernelbake key (expected prefix {KEY_SCHEMA!r}): {text!r}")
    values: dict[str, str] = {}
    for part in body.split(";"):
        name, eq, value = part.partition("=")
        if not eq:
            raise InvalidKey(f"key part {part!r} is not name=value in {text!r}")
        if name in values:
            raise InvalidKey(f"key field {name!r} appears twice in {text!r}")
        values[name] = unquote(value)
    return key_from_fields(values, source=repr(text))


def key_from_fields(values: Mapping[str, str], *, source: str) -> CacheKey:
    order = CacheKey.field_order()
    missing = [n for n in order if n not in values]
    unknown = [n for n in values if n not in order]
    if missing or unknown:
        raise InvalidKey(f"key {source}: missing fields {missing}, unknown fields {unknown}")
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(CacheKey):
        raw = values[f.name]
        if f.name == "engine":
            try:
                kwargs[f.name] = Engine(raw)
            except ValueError:
                raise InvalidKey(f"key {source}: unknown engine {raw!r}") from None
        elif f.type == "int":
            if not raw.isdigit():
                raise InvalidKey(f"key {source}: field {f.name}={raw!r} is not an integer")
            kwargs[f.name] = int(raw)
        else:
            kwargs[f.name] = raw
    return CacheKey(**kwargs)


def key_from_labels(labels: Mapping[str, str]) -> CacheKey:
    """Rebuild the key from OCI labels and insist that every copy in them agrees.

    The per-field labels, the canonical ``dev.kernelbake.key`` label and its digest are
    redundant on purpose: an edit to any one of them after signing is caught here.
    """
    if LABEL_KEY not in labels:
        raise InvalidKey(f"image has no {LABEL_KEY} label: not built by kernelbake")
    key = parse_key(labels[LABEL_KEY])
    fields = {name: labels.get(f"{LABEL_NS}.{name.replace('_', '-')}", "") for name in CacheKey.field_order()}
    if fields != key.as_dict():
        differ = sorted(n for n, v in fields.items() if v != key.as_dict()[n])
        raise InvalidKey(f"labels disagree with {LABEL_KEY} on {', '.join(differ)}")
    if labels.get(LABEL_DIGEST) != key.digest:
        raise InvalidKey(
            f"label {LABEL_DIGEST}={labels.get(LABEL_DIGEST)!r} is not the key's digest {key.digest}"
        )
    return key
