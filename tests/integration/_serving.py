"""What the integration suites that serve tiny-llama share: waiting until vLLM's /health
answers in a container, its logs, and one completion."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from typing import Any, Protocol

MODEL = "/models/tiny-llama"


class Engine(Protocol):
    """``tests.support.docker.docker`` or ``tests.support.podman.podman``."""

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]: ...


def logs(engine: Engine, cid: str) -> str:
    res = engine("logs", cid, check=False)
    return res.stdout + res.stderr


def wait_healthy(engine: Engine, port: int, cid: str, timeout_s: float) -> None:
    """Until vLLM in container ``cid`` answers /health on ``port``; fails with its log's tail
    when the container stops or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        state = engine("inspect", "-f", "{{.State.Running}}", cid).stdout.strip()
        if state != "true" or time.monotonic() > deadline:
            raise AssertionError(f"vLLM did not become healthy:\n{logs(engine, cid)[-4000:]}")
        time.sleep(1)


def wait_for_serve_line(engine: Engine, cid: str, text: str, timeout_s: float = 180) -> str:
    """The first ``kernelbake serve:`` line of container ``cid``'s log that contains ``text``,
    waiting for it: serve prints what the start compiled once vLLM says it is ready, after
    reading every cache file (``start-up compiled nothing …``, or after a start that compiled
    ``WARNING: start-up compiled what the caches lacked …``, which is why this matches text
    anywhere in the line, not a prefix)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = logs(engine, cid).splitlines()
        found = [ln for ln in lines if ln.startswith("kernelbake serve:") and text in ln]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no kernelbake serve: line with {text!r}:\n{logs(engine, cid)[-4000:]}")
        time.sleep(0.5)


def complete(port: int, prompt: str = "Hello", tokens: int = 4) -> dict[str, Any]:
    """One greedy completion of ``prompt`` from the server on ``port``."""
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": tokens, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return doc
