"""Closest-name suggestions for unknown keys, GPUs and engines."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` or a list of valid choices, for appending to a message."""
    options = sorted(choices)
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; expected one of: {', '.join(options)}"
