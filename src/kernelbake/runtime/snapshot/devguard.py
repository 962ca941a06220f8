"""vLLM's development endpoints on loopback only, for a snapshot taken with its weights left out.

Such a snapshot puts the engine to sleep before the dump (``/sleep?level=2``) and wakes it and
reloads its weights after the restore (``/wake_up``, ``/collective_rpc``), endpoints vLLM serves
only with ``VLLM_SERVER_DEV_MODE=1``. That variable is frozen into the snapshot and so into every
restored replica, where ``/collective_rpc`` would let any client call any worker method. So
``take`` requires this middleware in the server (``--middleware`` ``MIDDLEWARE``, an ASGI hook
vLLM's API server loads by import path): a client that is not on this host's loopback reaches
the serving API alone (``PUBLIC``, by path prefix; anything else gets 403, so an endpoint a later
release adds is closed until listed). ``serve`` and ``take`` call from 127.0.0.1. Where this
ends: every container of the pod shares its loopback, so a sidecar can reach the development
endpoints too.

It also keeps ``/health`` at 503 while ``RELOADING_MARK`` exists: serve's restore of such a
snapshot is back at ``/health`` before its weights are (woken, reloaded), and a readiness probe on
``/health`` must see it ready only once it serves.

Imported by vLLM's API server process, never by kernelbake's own; starlette comes with vLLM.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kernelbake.contract.snapshot import RELOADING_MARK

MIDDLEWARE = "kernelbake.runtime.snapshot.devguard.loopback_only"
_RELOADING = Path(RELOADING_MARK)
# What any client may reach: the OpenAI-compatible API, health, metrics and the model's own
# serving routes (prefixes, matched on whole path segments).
PUBLIC = (
    "/v1",
    "/v2",
    "/health",
    "/ping",
    "/version",
    "/metrics",
    "/load",
    "/tokenize",
    "/detokenize",
    "/invocations",
    "/pooling",
    "/classify",
    "/score",
    "/rerank",
)


def allowed(path: str, client: str | None) -> bool:
    """Whether ``client`` (an address, or None when the server cannot tell) may reach ``path``."""
    if any(path == p or path.startswith(p + "/") for p in PUBLIC):
        return True
    if client is None:
        return False
    try:
        return ipaddress.ip_address(client).is_loopback
    except ValueError:
        return False


def _refuse(path: str) -> Any:
    from starlette.responses import JSONResponse  # type: ignore[import-not-found,unused-ignore]

    return JSONResponse(
        {
            "error": f"{path} is served to this host's loopback only (kernelbake snapshot: development endpoint)"
        },
        status_code=403,
    )


def _reloading() -> Any:
    from starlette.responses import JSONResponse  # type: ignore[import-not-found,unused-ignore]

    return JSONResponse(
        {"error": "restored from a snapshot; its weights are being reloaded (kernelbake serve)"},
        status_code=503,
    )


async def loopback_only(request: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    client = request.client.host if request.client is not None else None
    if request.url.path == "/health" and _RELOADING.exists():
        return _reloading()
    if allowed(request.url.path, client):
        return await call_next(request)
    return _refuse(request.url.path)
