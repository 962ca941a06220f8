"""Commands that run inside images: ``compile``, ``serve``, ``check``, ``fetch-model``, ``seed-cache``."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from kernelbake.errors import KeyMismatch
from kernelbake.runtime.env import RuntimeEnv


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


def cmd_serve(args: argparse.Namespace) -> int:
    from kernelbake.runtime.serving import serve

    return serve(RuntimeEnv.from_env(), list(args.engine_args))


def cmd_check(args: argparse.Namespace) -> int:
    from kernelbake.runtime.engines import get_engine
    from kernelbake.runtime.env import VerifyMode
    from kernelbake.runtime.preflight import ask_engine, preflight
    from kernelbake.runtime.redact import Redactor

    env = RuntimeEnv.from_env()
    if args.unsafe_size_only:
        env = dataclasses.replace(env, verify=VerifyMode.UNSAFE_SIZE_ONLY)
    user_args = list(args.engine_args)
    verdict = preflight(env, user_args)
    if verdict.warm:
        # The engine's own verdict, computed by its code with the environment serve gives it.
        verdict = ask_engine(get_engine(verdict.target.key.engine), verdict, user_args)
        asked = verdict.prediction
        if args.identity_out and asked is not None and asked.identity is not None:
            args.identity_out.write_text(json.dumps(asked.identity, indent=1, sort_keys=True) + "\n")
    redact = Redactor.for_run(verdict.env, user_args)
    if args.json:
        print(redact(json.dumps(verdict.to_json(), indent=2)))
    else:
        for line in verdict.lines():
            print(redact(line))
    return 0 if verdict.predicted_hit else KeyMismatch.return_code


def cmd_engine_command(args: argparse.Namespace) -> int:
    """The command and launch variables ``serve`` starts the engine with (no user arguments),
    as JSON: a build records them on the cache artifact, so that the unchanged engine image
    can be started the way this image starts it, by the engine's own adapter's answer."""
    from kernelbake.contract.target import TargetConfig
    from kernelbake.runtime.engines import get_engine

    target = TargetConfig.load(RuntimeEnv.from_env().target_file)
    engine = get_engine(target.key.engine)
    doc = {"command": engine.serve_argv(target, []), "env": engine.launch_env()}
    print(json.dumps(doc, sort_keys=True))
    return 0


def cmd_fetch_model(args: argparse.Namespace) -> int:
    from kernelbake.runtime.fetch import fetch_model

    print(f"kernelbake fetch-model: {fetch_model(RuntimeEnv.from_env())}")
    return 0


def cmd_seed_cache(args: argparse.Namespace) -> int:
    from kernelbake.runtime.preflight import seed

    done = seed(RuntimeEnv.from_env(), args.dest)
    print(
        f"kernelbake seed-cache: {done.files} files copied from {done.root} to {args.dest}, each sha256-checked"
    )
    if done.skipped:
        print(
            f"kernelbake seed-cache: left behind {len(done.skipped)} not in the manifest, e.g. {done.skipped[0]}"
        )
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
        usage="kernelbake check [--json] [--unsafe-size-only] [--identity-out FILE] [SERVE ARGS...]",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--unsafe-size-only",
        action="store_true",
        help="compare cache file sizes only, not every file's sha256 (a same-size change passes)",
    )
    p.add_argument(
        "--identity-out",
        type=Path,
        help="write the engine's cache identity now (to diff against the manifest's)",
    )
    p.set_defaults(func=cmd_check, passthrough=True)

    p = sub.add_parser(
        "engine-command", help="(inside the image) the engine command and variables serve uses, as JSON"
    )
    p.set_defaults(func=cmd_engine_command)

    p = sub.add_parser("fetch-model", help="(inside the image) download config/tokenizer files")
    p.set_defaults(func=cmd_fetch_model)

    p = sub.add_parser("seed-cache", help="(inside the image) copy the baked caches to DEST")
    p.add_argument("dest", type=Path)
    p.set_defaults(func=cmd_seed_cache)
