"""The JSON of the webhook's bodies: a request's document read (``decode``) and an answer
written (``encode``).

A review's body is read by pydantic-core's ``from_json`` (jiter, in Rust; pydantic-core comes
with sigstore, and pyproject names it), not by ``json.loads``: decoding was a third of a warm
review's instructions, and jiter takes 159,000 where json takes 280,000 for the load mix's
bodies (callgrind). What it reads it reads as json does: the same values, types and key order,
the last of a repeated key, big integers, NaN and Infinity, and an integer past Python's 4,300
digits refused as ``int()`` refuses it (tests/admission/test_codec.py compares the two on
generated documents and on broken ones). What it refuses that json reads (a UTF-8 byte order
mark, UTF-16 or -32, an escaped lone surrogate) goes to ``json.loads``, whose answer or error is
then the one given: a body is refused exactly when json refuses it.
"""

from __future__ import annotations

import json
import json.scanner
from typing import Any

from pydantic_core import from_json

from kernelbake.contract import jsondoc

# Bodies larger than this are decoded by json's pure-Python scanner: the C one holds the GIL
# for the whole document (some 100 ms for 8 MiB on a busy core, bench/admission_adversarial.py),
# and with it the event loop and /healthz; the Python one lets the loop in at every switch
# interval, for 3 to 6 times the CPU. A real pod's review is far below it.
YIELDING_BODY = 1024 * 1024


def decode(body: bytes) -> Any:
    """The JSON document ``body``, as ``json.loads`` reads it (by jiter, see above); past
    ``YIELDING_BODY`` by the scanner that gives the GIL up while it works (see there). That
    scanner recurses in Python, so the depth is bounded first (``jsondoc``), for every reader."""
    jsondoc.refuse_deep(body)
    if len(body) <= YIELDING_BODY:
        try:
            return from_json(body)
        except ValueError:
            return json.loads(body)
    decoder = json.JSONDecoder()
    # A decoder of its own: the scanner keeps a memo of keys for the document it reads.
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder.decode(body.decode(json.detect_encoding(body), "surrogatepass"))


def encode(payload: Any) -> bytes:
    """``payload`` as compact JSON (``json.dumps`` with no spaces), UTF-8."""
    return jsondoc.compact(payload).encode()
