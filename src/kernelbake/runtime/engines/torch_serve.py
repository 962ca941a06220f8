"""The torch engine's server: ``python -m kernelbake.runtime.engines.torch_serve``.

``kernelbake serve`` execs it after the preflight, with the cache variables set. It loads
the model, runs the compiled warm-up on the baked shapes (the first compiled calls, which the
baked caches make fast), prints one JSON line with timings and Inductor's cache counters,
then serves a tiny HTTP API: ``GET /health``, ``GET /stats``, ``POST /v1/generate``
(``{"input_ids": [[...]], "max_new_tokens": n}`` → greedy token ids).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput, KernelbakeError
from kernelbake.runtime import gate
from kernelbake.runtime.env import RuntimeEnv

_MAX_NEW_TOKENS = 64


def _shapes(text: str) -> tuple[tuple[int, int], ...]:
    try:
        pairs = tuple(tuple(int(x) for x in part.split("x")) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BxS[,BxS...], got {text!r}") from None
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected BxS[,BxS...], got {text!r}")
    return tuple((p[0], p[1]) for p in pairs)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernelbake serve (torch)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--shapes", type=_shapes, help="warm-up shapes BxS[,BxS]; other than the baked ones misses"
    )
    p.add_argument("--warmup-only", action="store_true", help="print the warm-up report and exit")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The server's flags, as it reads them (``kernelbake check`` asks the same parser)."""
    return _parser().parse_known_args(list(argv))[0]


class _Server:
    def __init__(self, model: Any, stats: dict[str, Any]) -> None:
        self.model = model
        self.stats = stats
        self.lock = threading.Lock()

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        import torch

        ids = body.get("input_ids")
        steps = body.get("max_new_tokens", 1)
        if not isinstance(ids, list) or not ids or not all(isinstance(r, list) and r for r in ids):
            raise BadInput("input_ids: expected a non-empty list of non-empty token lists")
        if not isinstance(steps, int) or not 1 <= steps <= _MAX_NEW_TOKENS:
            raise BadInput(f"max_new_tokens: expected 1..{_MAX_NEW_TOKENS}")
        tokens = torch.tensor(ids, dtype=torch.long)
        with self.lock, torch.inference_mode():
            for _ in range(steps):
                logits = self.model(input_ids=tokens, use_cache=False).logits
                tokens = torch.cat([tokens, logits[:, -1:].argmax(-1)], dim=1)
        return {"output_ids": tokens[:, -steps:].tolist()}


def _handler(server: _Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, doc: dict[str, Any]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._reply(200, {"status": "ok"})
            elif self.path == "/stats":
                self._reply(200, server.stats)
            else:
                self._reply(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            if self.path != "/v1/generate":
                self._reply(404, {"error": f"no route {self.path}"})
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                body = jsondoc.loads(self.rfile.read(length) or b"{}")
                self._reply(200, server.generate(body))
            except (BadInput, ValueError) as exc:
                self._reply(400, {"error": str(exc)})

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write(f"torch_serve: {self.address_string()} {format % args}\n")

    return Handler


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from kernelbake.runtime.engines.torch_model import load_and_warm

    try:
        env = RuntimeEnv.from_env()
        target = TargetConfig.load(env.target_file)
        model, report = load_and_warm(target, args.shapes, before_compile=lambda: gate.wait(env))
    except KernelbakeError as exc:
        print(f"torch_serve: error: {exc}", file=sys.stderr)
        return exc.return_code
    stats = {"event": "ready", **report.to_json()}
    print(json.dumps(stats), flush=True)
    if args.warmup_only:
        return 0
    httpd = ThreadingHTTPServer((args.host, args.port), _handler(_Server(model, stats)))
    print(f"torch_serve: listening on {args.host}:{args.port}", file=sys.stderr, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        httpd.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
