"""The few HTTP calls a snapshot makes to its own engine on localhost (health, warm-up, sleep,
wake-up and the weights' reload)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def status(url: str, *, timeout: float = 1.0) -> int | None:
    """The HTTP status of ``GET url``; None when nothing answers."""
    return _status(url, timeout)


def get_json(url: str, *, timeout: float = 30.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def post_json(url: str, body: Any, *, timeout: float = 120.0) -> Any:
    with urllib.request.urlopen(_post(url, body), timeout=timeout) as r:
        return json.loads(r.read())


def post(url: str, body: Any, *, timeout: float = 120.0) -> int | None:
    """The HTTP status of ``POST url`` with a JSON body (vLLM's /sleep and /wake_up answer with
    no body); None when nothing answers."""
    return _status(_post(url, body), timeout)


def _post(url: str, body: Any) -> urllib.request.Request:
    return urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )


def _status(request: str | urllib.request.Request, timeout: float) -> int | None:
    """The status of the answer to ``request``, its body read and dropped; an error status
    too; None when nothing answers."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


# What ``serve`` asks a restored engine that sleeps without its weights, and ``take`` asks once
# before the dump: vLLM's worker method that reloads from the files its load format reads.
RELOAD_WEIGHTS = "reload_weights"


def rpc(base: str, method: str, *, timeout: float, **kwargs: str) -> tuple[int | None, Any]:
    """``method`` of each worker through vLLM's ``/collective_rpc`` (its arguments are strings,
    as vLLM's endpoint passes only those): the status and the first worker's answer (None
    without one); an error's body as text, for the message."""
    request = _post(f"{base}/collective_rpc", {"method": method, "kwargs": kwargs, "timeout": timeout})
    try:
        with urllib.request.urlopen(request, timeout=timeout + 5) as r:
            results = json.loads(r.read() or b"{}").get("results") or [None]
            return int(r.status), results[0]
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()[-400:].decode(errors="replace")
    except (OSError, ValueError):
        return None, None
