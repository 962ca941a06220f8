"""``kernelbake capture replay``: a record's waves sent to this image's own server, each wave's
requests at once, inside the trusted rebuild (``capture rebuild`` starts the image by digest,
with no network and fake weights, and runs this in it). A class ``serve`` noted has no prompt:
it gets as many made-up token IDs as the replica's prompt had tokens (``contract.record``).

The record is the replica's word: it must be for this image (its key and pinned manifest), and
each request is bounded (``contract.record``). Requests go to the server on the loopback only;
what they compile lands in the image's cache root, where ``capture collect`` then takes it.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kernelbake.contract.record import CaptureRecord
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput, EnvironmentProblem
from kernelbake.runtime import pin
from kernelbake.runtime.env import RuntimeEnv

# A cold CPU replica is ready in about a minute; a GPU one, with its engine's own start, later.
READY_TIMEOUT = 1200.0
REQUEST_TIMEOUT = 600.0

# (method, url, body or None, timeout) -> parsed JSON; tests pass a fake server.
Fetch = Callable[[str, str, dict[str, Any] | None, float], Any]


def _fetch(method: str, url: str, body: dict[str, Any] | None, timeout: float) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw.strip() else {}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Replayed:
    model: str
    seconds: tuple[float, ...]  # per wave, until its last answer
    requests: int
    failed: tuple[str, ...]  # wave i request j: why, for what the server refused

    def lines(self) -> list[str]:
        head = [
            f"replayed {self.requests} requests in {len(self.seconds)} batches on {self.model} "
            f"({', '.join(f'{s:.2f} s' for s in self.seconds)})"
        ]
        return head + [f"request {f}" for f in self.failed]


def load(env: RuntimeEnv, path: Path) -> CaptureRecord:
    """The record at ``path``, refused unless it was recorded on this very image."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the capture record ({exc.strerror or exc})") from None
    record = CaptureRecord.from_json(text, source=str(path))
    target = TargetConfig.load(env.target_file)
    base = pin.digest(env.pinned_manifest.read_bytes())
    if record.key != target.key or record.base_manifest != base:
        raise BadInput(
            f"{path}: recorded on key {record.key.digest} over the bundle {record.base_manifest}; this image "
            f"is key {target.key.digest} over {base}: rebuild it from the image the replica ran"
        )
    return record


def _ready(base: str, fetch: Fetch, timeout: float, sleep: Callable[[float], None]) -> str:
    """The served model's name, once the server answers."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            models = fetch("GET", f"{base}/v1/models", None, 10.0)
            return str(models["data"][0]["id"])
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        sleep(1.0)
    raise EnvironmentProblem(f"{base}: the server did not answer within {timeout:.0f} s ({last})")


def _body(body: dict[str, Any], prompt: Any, model: str) -> dict[str, Any]:
    """What is sent: the class, its prompt, this server's model. Made-up token IDs come back as
    token IDs (vLLM's ``return_tokens_as_token_ids``): a server without a tokenizer
    (``--skip-tokenizer-init``, as the bench models have) has no other name for the logprobs'
    tokens, and bench/request_mix.py sends it so to such servers."""
    made_up = {"return_tokens_as_token_ids": True} if isinstance(prompt, list) else {}
    return {**made_up, **body, "prompt": prompt, "model": model, "stream": False}


# What of a refusal's body is shown: vLLM says there which field it refused and why.
_MAX_SAID = 200


def _said(exc: urllib.error.HTTPError) -> str:
    """': <the server's message>' from an error answer (vLLM's ``{"error": {"message": …}}``
    or ``{"message": …}``), bounded and on one line; '' when there is none to read."""
    try:
        raw = exc.read(16 * 1024) if exc.fp is not None else b""
        doc = json.loads(raw) if raw else None
    except (OSError, ValueError):
        return ""
    if not isinstance(doc, dict):
        return ""
    inner = doc.get("error")
    message = (inner if isinstance(inner, dict) else doc).get("message")
    if not isinstance(message, str) or not message.strip():
        return ""
    flat = " ".join("".join(c if c.isprintable() else " " for c in message).split())
    return ": " + (flat if len(flat) <= _MAX_SAID else flat[: _MAX_SAID - 1] + "…")


def _send(fetch: Fetch, base: str, body: dict[str, Any]) -> str | None:
    """One request; why it failed, or None."""
    try:
        fetch("POST", f"{base}/v1/completions", body, REQUEST_TIMEOUT)
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}{_said(exc)}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def replay(
    record: CaptureRecord,
    *,
    port: int = 8000,
    fetch: Fetch = _fetch,
    ready_timeout: float = READY_TIMEOUT,
    sleep: Callable[[float], None] = time.sleep,
) -> Replayed:
    """Each wave of the record in order, its requests sent at once (so the server batches them
    as it batched the replica's), on the loopback. A request the server refuses is named, not
    fatal: what it would compile is then missing, and the rebuild drops it."""
    base = f"http://127.0.0.1:{port}"
    model = _ready(base, fetch, ready_timeout, sleep)
    seconds: list[float] = []
    failed: list[str] = []
    count = 0
    for w, bodies in enumerate(record.sends()):
        started = time.monotonic()
        sent = [_body(body, prompt, model) for body, prompt in bodies]
        count += len(sent)
        with ThreadPoolExecutor(max_workers=len(sent)) as pool:
            answers = list(pool.map(lambda b: _send(fetch, base, b), sent))
        failed += [f"{w}.{i}: {why}" for i, why in enumerate(answers) if why is not None]
        seconds.append(round(time.monotonic() - started, 3))
    return Replayed(model=model, seconds=tuple(seconds), requests=count, failed=tuple(failed))
