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
# Memory of its own the dump must carry (written, so that every page is there), as a test asks.
held = b"k" * (int(os.environ.get("STANDIN_HOLD_MB", "0")) << 20)
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


# The same tree's server with weights that sleep (``take --weights beside``): three regions of
# its own memory (mmap) filled with a seeded pattern, which /sleep unmaps (so the dump holds
# none of them), /wake_up maps back, empty, at the same addresses, and /collective_rpc saves
# and copies back through kernelbake's own snapshot_weights (memmove standing in for the
# device's copy); /count adds the regions' sha256 and whether it sleeps.
WEIGHTS = r"""
import ctypes, hashlib, random
from kernelbake.runtime.engines.vllm import snapshot_weights as sw
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
RW, PRIVATE_ANON, FIXED = 0x3, 0x22, 0x10
def mapped(size, at=None):
    addr = libc.mmap(at, size, RW, PRIVATE_ANON | (FIXED if at else 0), -1, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value) and (at is None or addr == at)
    return addr
rng = random.Random(7)
regions = [(mapped(n), n) for n in (3 << 20, 1 << 20, 5 << 20)]
for addr, n in regions:
    ctypes.memmove(addr, rng.randbytes(n), n)
asleep = {"now": False}
def digest():
    return hashlib.sha256(b"".join(ctypes.string_at(a, n) for a, n in regions)).hexdigest()
def staging():
    raw = bytearray(1 << 20)
    view = (ctypes.c_char * len(raw)).from_buffer(raw)
    return sw.Staging(address=ctypes.addressof(view), view=memoryview(raw), owner=(raw, view))
def allocations():
    return [sw.Allocation(a, n, asleep["now"]) for a, n in regions]
class Rank:
    rank = 0
def rpc(doc):
    folder = sw.rank_folder(doc["kwargs"]["path"], Rank())
    if doc["method"] == "kernelbake_save_weights":
        return sw.save(folder, allocations(), ctypes.memmove, staging())
    if doc["method"] == "kernelbake_load_weights":
        return sw.load(folder, allocations(), ctypes.memmove, staging, workers=2)
    raise NotImplementedError(doc["method"])
"""

# Its GET lines and POST handler, in place of SERVER's.
WEIGHTS_GET = r"""
        elif self.path == "/weights": self._send(200, {"sha256": digest(), "asleep": asleep["now"]})
        elif self.path == "/is_sleeping": self._send(200, {"is_sleeping": asleep["now"]})
"""
WEIGHTS_POST = r"""
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/sleep"):
            for addr, n in regions: libc.munmap(addr, n)
            asleep["now"] = True; return self._send(200, {})
        if self.path == "/wake_up":
            for addr, n in regions: mapped(n, addr)
            asleep["now"] = False; return self._send(200, {})
        if self.path == "/collective_rpc":
            try: return self._send(200, {"results": [rpc(json.loads(body))]})
            except Exception as exc: return self._send(500, {"error": repr(exc)})
        state["count"] += 1
        self._send(200, {"choices": [{"text": " world"}]})
"""


def weights_server() -> str:
    """SERVER with WEIGHTS: /weights, /is_sleeping, /sleep, /wake_up and /collective_rpc."""
    get_end = SERVER.index('        elif self.path == "/quit":')
    post, log = SERVER.index("    def do_POST(self):"), SERVER.index("    def log_message")
    return (
        WEIGHTS
        + SERVER[:get_end]
        + WEIGHTS_GET.lstrip("\n")
        + SERVER[get_end:post]
        + WEIGHTS_POST.lstrip("\n")
        + SERVER[log:]
    )


def beside_args() -> tuple[str, ...]:
    """The engine arguments a snapshot with its weights beside is taken and restored with (take
    refuses one without them; the key records them)."""
    from kernelbake.contract.snapshot import WEIGHTS_EXTENSION
    from kernelbake.runtime.snapshot.devguard import MIDDLEWARE

    return ("--enable-sleep-mode", "--middleware", MIDDLEWARE, "--worker-extension-cls", WEIGHTS_EXTENSION)


def take(out: Path, image: str, beside: bool = False) -> dict[str, object]:
    from kernelbake.contract.snapshot import Weights
    from kernelbake.runtime.env import RuntimeEnv
    from kernelbake.runtime.snapshot.criu import Criu
    from kernelbake.runtime.snapshot.driver import NoDriver
    from kernelbake.runtime.snapshot.take import Options
    from kernelbake.runtime.snapshot.take import take as take_

    env = RuntimeEnv.from_env()
    options = Options(
        image=image,
        command=(sys.executable, "-c", weights_server() if beside else SERVER),
        deadline_s=20.0,
        user_args=beside_args() if beside else (),
        weights=Weights.BESIDE if beside else Weights.INSIDE,
    )
    done = take_(env, out, options, driver=NoDriver(), criu=Criu(env.criu))
    return {"lines": done.lines(), "digest": done.manifest.digest, "taken": dict(done.manifest.taken)}


def restore(beside: bool = False) -> dict[str, object]:
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
        if beside:
            # Once serve says it serves: the weights as the engine holds them now.
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen("http://127.0.0.1:8000/weights", timeout=5) as r,
            ):
                seen["weights"] = json.loads(r.read())
        with contextlib.suppress(OSError):
            urllib.request.urlopen("http://127.0.0.1:8000/quit", timeout=5).close()

    t = time.monotonic()
    watcher = threading.Thread(target=client, daemon=True)
    watcher.start()
    args = list(beside_args()) if beside else []
    rc = start_from_snapshot(env, args, driver=NoDriver(), criu=Criu(env.criu), say=said.append)
    watcher.join(5)
    return {"rc": rc, "said": said, "seen": seen, "seconds": round(time.monotonic() - t, 3)}


if __name__ == "__main__":
    beside = sys.argv[-1] == "beside"
    doc = take(Path(sys.argv[2]), sys.argv[3], beside) if sys.argv[1] == "take" else restore(beside)
    print("RESULT " + json.dumps(doc), flush=True)
