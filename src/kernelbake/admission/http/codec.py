"""The JSON of the webhook's bodies: a request's document read (``decode``) and an answer
written (``encode``)."""

from __future__ import annotations

import json
import json.scanner
from typing import Any

from kernelbake.contract import jsondoc

# Bodies larger than this are decoded by json's pure-Python scanner: the C one holds the GIL
# for the whole document (some 100 ms for 8 MiB on a busy core, bench/admission_adversarial.py),
# and with it the event loop and /healthz; the Python one lets the loop in at every switch
# interval, for 3 to 6 times the CPU. A real pod's review is far below it.
YIELDING_BODY = 1024 * 1024

# Made once: json.dumps with separators builds a JSONEncoder per call, a quarter of what
# encoding a warm review's answer costs (callgrind).
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def decode(body: bytes) -> Any:
    """The JSON document ``body``, as ``json.loads`` reads it; past ``YIELDING_BODY`` by the
    scanner that gives the GIL up while it works (see there). That scanner recurses in Python,
    so the depth is bounded first (``jsondoc``), for either scanner."""
    jsondoc.refuse_deep(body)
    if len(body) <= YIELDING_BODY:
        return json.loads(body)
    decoder = json.JSONDecoder()
    # A decoder of its own: the scanner keeps a memo of keys for the document it reads.
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder.decode(body.decode(json.detect_encoding(body), "surrogatepass"))


def encode(payload: Any) -> bytes:
    """``payload`` as compact JSON (``json.dumps`` with no spaces), UTF-8."""
    return _COMPACT.encode(payload).encode()
