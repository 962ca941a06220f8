"""Commands that run inside images: ``compile``, ``serve``, ``check``, ``fetch-model``, ``seed-cache``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kernelbake.errors import KeyMismatch
from kernelbake.runner import run
from kernelbake.runtime.env import RuntimeEnv

if TYPE_CHECKING:
    from kernelbake.runtime.preflight import Verdict


def _owner(text: str) -> tuple[int, int]:
    uid, _, gid = text.partition(":")
    try:
        return int(uid), int(gid or uid)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected UID:GID, got {text!r}") from None


def cmd_compile(args: argparse.Namespace) -> int:
    from kernelbake.runtime.compile import run_compile

    run_compile(RuntimeEnv.from_env(), owner=args.chown)
    return 0


def _say(lines: list[str]) -> None:
    for line in lines:
        for part in line.split("\n"):
            print(f"kernelbake serve: {part}", file=sys.stderr, flush=True)


def cmd_serve(args: argparse.Namespace) -> int:
    from kernelbake.runtime.engines import get_engine
    from kernelbake.runtime.preflight import preflight
    from kernelbake.runtime.redact import Redactor

    env = RuntimeEnv.from_env()
    user_args = list(args.engine_args)
    redact = Redactor.for_run(env.environ, user_args)
    started = time.monotonic()
    verdict = preflight(env, user_args)
    # Preflight sits on every replica's start path; its cost should be on record.
    _say([redact(x) for x in [*verdict.lines(), f"preflight took {time.monotonic() - started:.1f} s"]])
    engine = get_engine(verdict.target.key.engine)
    argv = engine.serve_argv(verdict.target, user_args)
    watch = engine.serve_watcher(verdict.cache_root)
    if watch is None:
        _say([f"exec {' '.join(redact.argv(argv))}"])
        os.execvpe(argv[0], argv, verdict.env)

    def report(line: str) -> None:
        if message := watch(line):
            _say([redact(message)])
            _write_status(env.status_file, verdict, watch, redact)

    # Supervised rather than exec'd, to read the engine's own word on the caches. The
    # engine's output is forwarded with secret values replaced (vLLM echoes its arguments).
    return run(argv, env=verdict.env, on_line=report, forward_signals=True, redact=redact).returncode


def _write_status(
    path: Path | None, verdict: Verdict, watch: Callable[[str], str | None], redact: Callable[[str], str]
) -> None:
    """The JSON status: the preflight, the engine's prediction and what the engine then did
    (an engine's watcher that knows it has a ``status()``)."""
    status = getattr(watch, "status", None)
    if path is None or not callable(status):
        return
    doc = {"preflight": verdict.to_json(), **status()}
    with contextlib.suppress(OSError):
        path.write_text(redact(json.dumps(doc, indent=1, sort_keys=True, default=str)) + "\n")


def cmd_check(args: argparse.Namespace) -> int:
    from kernelbake.runtime.engines import get_engine
    from kernelbake.runtime.env import VerifyMode
    from kernelbake.runtime.preflight import preflight
    from kernelbake.runtime.redact import Redactor

    # A check has the time to hash everything, which serve skips by default.
    mode = VerifyMode.SIZE if args.fast else VerifyMode.DEEP
    env = dataclasses.replace(RuntimeEnv.from_env(), verify=mode)
    user_args = list(args.engine_args)
    verdict = preflight(env, user_args)
    if verdict.warm:
        # The engine's own verdict, computed by its code with the environment serve gives it.
        engine = get_engine(verdict.target.key.engine)
        asked = engine.predict(verdict.target, user_args, verdict.env)
        if asked is not None:
            verdict = dataclasses.replace(verdict, prediction=asked)
            if args.identity_out and asked.identity is not None:
                args.identity_out.write_text(json.dumps(asked.identity, indent=1, sort_keys=True) + "\n")
    redact = Redactor.for_run(verdict.env, user_args)
    if args.json:
        print(redact(json.dumps(verdict.to_json(), indent=2)))
    else:
        for line in verdict.lines():
            print(redact(line))
    return 0 if verdict.predicted_hit else KeyMismatch.return_code


def cmd_fetch_model(args: argparse.Namespace) -> int:
    from kernelbake.runtime.fetch import fetch_model

    print(f"kernelbake fetch-model: {fetch_model(RuntimeEnv.from_env())}")
    return 0


def cmd_seed_cache(args: argparse.Namespace) -> int:
    from kernelbake.runtime.config import TargetConfig
    from kernelbake.runtime.preflight import seed

    target = TargetConfig.load(RuntimeEnv.from_env().target_file)
    count = seed(Path(target.cache_root), args.dest)
    print(f"kernelbake seed-cache: {count} files copied from {target.cache_root} to {args.dest}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("compile", help="(inside the image) compile and write the cache bundle")
    p.add_argument("--chown", type=_owner, help="give the bundle to UID:GID afterwards (two-phase builds)")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser(
        "serve",
        help="(inside the image) preflight, then exec the engine",
        usage="kernelbake serve [ENGINE ARGS...]",
    )
    p.set_defaults(func=cmd_serve, passthrough=True)

    p = sub.add_parser(
        "check",
        help="(inside the image) preflight only: would serve start warm?",
        usage="kernelbake check [--json] [--fast] [--identity-out FILE] [SERVE ARGS...]",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--fast", action="store_true", help="check sizes only, not every file's sha256")
    p.add_argument(
        "--identity-out",
        type=Path,
        help="write the engine's cache identity now (to diff against the manifest's)",
    )
    p.set_defaults(func=cmd_check, passthrough=True)

    p = sub.add_parser("fetch-model", help="(inside the image) download config/tokenizer files")
    p.set_defaults(func=cmd_fetch_model)

    p = sub.add_parser("seed-cache", help="(inside the image) copy the baked caches to DEST")
    p.add_argument("dest", type=Path)
    p.set_defaults(func=cmd_seed_cache)
