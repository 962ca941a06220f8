"""Run inside a container (plain Python, no engine): ``take`` or ``restore`` of a stand-in
serving tree with the real CRIU, through ``kernelbake.runtime.snapshot``; prints one JSON line.

The tree: an HTTP server (the "API server") with one child (the "engine core"), answering as
vLLM does for the warm-up (/v1/models, /v1/completions) and /health, /count (requests served
so far, which a restored tree must remember) and /quit."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

SERVER = r"""
import http.server, json, os, subprocess, sys, threading
child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.2)"])
state = {"count": 0}
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def _send(self, code, doc):
        body = json.dumps(doc).encode()
        self.send_response(code); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/health": self._send(200, {})
        elif self.path == "/v1/models": self._send(200, {"data": [{"id": "tiny"}]})
        elif self.path == "/count": self._send(200, {"count": state["count"], "child_alive": child.poll() is None})
        elif self.path == "/quit":
            self._send(200, {}); child.kill(); child.wait(); threading.Thread(target=s.shutdown).start()
        else: self._send(404, {})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        state["count"] += 1
        self._send(200, {"choices": [{"text": " world"}]})
    def log_message(self, *a): print(*a, flush=True)
s = http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H)
s.daemon_threads = True
s.serve_forever()
"""


def take(out: Path, image: str) -> dict[str, object]:
    from kernelbake.runtime.env import RuntimeEnv
    from kernelbake.runtime.snapshot.criu import Criu
    from kernelbake.runtime.snapshot.driver import NoDriver
    from kernelbake.runtime.snapshot.take import Options
    from kernelbake.runtime.snapshot.take import take as take_

    env = RuntimeEnv.from_env()
    done = take_(
        env,
        out,
        Options(image=image, command=(sys.executable, "-c", SERVER), deadline_s=20.0),
        driver=NoDriver(),
        criu=Criu(env.criu),
    )
    return {"lines": done.lines(), "digest": done.manifest.digest, "taken": dict(done.manifest.taken)}


def restore() -> dict[str, object]:
    from kernelbake.runtime.env import RuntimeEnv
    from kernelbake.runtime.snapshot.criu import Criu
    from kernelbake.runtime.snapshot.driver import NoDriver
    from kernelbake.runtime.snapshot.restore import start_from_snapshot

    env = RuntimeEnv.from_env()
    said: list[str] = []
    seen: dict[str, object] = {}

    def client() -> None:
        # Once the restored tree answers: what it remembers, then, once the restore has said
        # how it went, stop it. Stopped sooner, the tree could end before serve's own /health
        # poll saw it answer (a loaded CI machine did this), which is a failed restore.
        end = time.monotonic() + 60
        while time.monotonic() < end and not seen:
            try:
                with urllib.request.urlopen("http://127.0.0.1:8000/count", timeout=1) as r:
                    seen.update(json.loads(r.read()))
            except OSError:
                time.sleep(0.1)
        while time.monotonic() < end and not said:
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            urllib.request.urlopen("http://127.0.0.1:8000/quit", timeout=5).close()

    t = time.monotonic()
    watcher = threading.Thread(target=client, daemon=True)
    watcher.start()
    rc = start_from_snapshot(env, [], driver=NoDriver(), criu=Criu(env.criu), say=said.append)
    watcher.join(5)
    return {"rc": rc, "said": said, "seen": seen, "seconds": round(time.monotonic() - t, 3)}


if __name__ == "__main__":
    doc = take(Path(sys.argv[2]), sys.argv[3]) if sys.argv[1] == "take" else restore()
    print("RESULT " + json.dumps(doc), flush=True)
