"""Secrets never leave as values: variables and flags that carry one show only a short digest.

vLLM marks nothing as sensitive, and it hashes ``VLLM_API_KEY`` into its compile key, so a
key's value would otherwise reach verdicts, logs and the manifest. A name carries a secret
when its words say so (``VLLM_API_KEY``, ``HF_TOKEN``, ``--api-key``,
``S3_SECRET_ACCESS_KEY``); ``long_prefill_token_threshold`` does not.
Equal values give equal digests, so verdicts still compare them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# A name ending in one of these carries a secret (``VLLM_API_KEY``, ``HF_TOKEN``); one that
# has any of the stronger ones anywhere does too (``S3_SECRET_ACCESS_KEY_ID``).
_SECRET_LAST = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "credential", "credentials"}
)
_SECRET_ANY = frozenset({"secret", "password", "passwd", "credential", "credentials", "apikey"})
_WORD = re.compile(r"[^a-z0-9]+")
# Shorter values are not worth hiding and would turn ordinary words into digests.
_MIN_SECRET = 4


def is_secret(name: str) -> bool:
    words = [w for w in _WORD.split(name.lower()) if w]
    return bool(words) and (words[-1] in _SECRET_LAST or any(w in _SECRET_ANY for w in words))


def digest(value: str) -> str:
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:12]


def shown(name: str, value: Any) -> Any:
    """``value`` as it may be shown or stored under ``name``."""
    if value is None or not is_secret(name) or isinstance(value, bool) or _is_digest(value):
        return value
    return digest(str(value))


def _is_digest(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 19 and value.startswith("sha256:")


def tree(doc: Any, name: str = "") -> Any:
    """A JSON-like document with every value under a secret-carrying name digested."""
    if isinstance(doc, Mapping):
        return {str(k): tree(v, str(k)) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [tree(v, name) for v in doc]
    return shown(name, doc) if name else doc


def secret_flags(argv: Sequence[str]) -> list[str]:
    """The secret-carrying flags ``argv`` sets (``--api-key``), named without their values."""
    return [flag for a in argv if a.startswith("-") and is_secret(flag := a.partition("=")[0])]


def argv_secrets(argv: Sequence[str]) -> list[str]:
    """Values of secret-carrying flags in ``argv`` (``--api-key X`` and ``--api-key=X``)."""
    found = []
    for i, arg in enumerate(argv):
        if not arg.startswith("-"):
            continue
        flag, eq, value = arg.partition("=")
        if not is_secret(flag):
            continue
        if eq:
            found.append(value)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            found.append(argv[i + 1])
    return found


class Redactor:
    """Replaces every known secret value in text by its digest (for lines kernelbake prints
    or forwards, including the engine's own output, which echoes its arguments)."""

    def __init__(self, values: Iterable[str]) -> None:
        self._values = sorted({v for v in values if len(v) >= _MIN_SECRET}, key=len, reverse=True)

    @classmethod
    def for_run(cls, environ: Mapping[str, str], argv: Sequence[str] = ()) -> Redactor:
        return cls([v for k, v in environ.items() if is_secret(k)] + argv_secrets(argv))

    def __call__(self, text: str) -> str:
        for value in self._values:
            if value in text:
                text = text.replace(value, digest(value))
        return text

    def argv(self, argv: Sequence[str]) -> list[str]:
        return [self(a) for a in argv]


class RedactingStream:
    """A text stream that writes through ``redact`` (for an engine run in this process,
    whose own log lines may echo its arguments)."""

    def __init__(self, stream: Any, redactor: Redactor) -> None:
        self._stream = stream
        self._redact = redactor

    def write(self, text: str) -> int:
        self._stream.write(self._redact(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
