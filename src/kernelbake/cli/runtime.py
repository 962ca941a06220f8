"""Commands that run inside images: ``compile``, ``serve``, ``check``, ``fetch-model``, ``seed-cache``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kernelbake.cli._in_image import IN_IMAGE
from kernelbake.runtime.env import RuntimeEnv

if TYPE_CHECKING:
    from kernelbake.runtime.serve.check import CheckResult


def _owner(text: str) -> tuple[int, int]:
    uid, _, gid = text.partition(":")
    try:
        return int(uid), int(gid or uid)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected UID:GID, got {text!r}") from None


def cmd_compile(args: argparse.Namespace) -> int:
    from kernelbake.runtime.compile.stage import run_compile

    run_compile(RuntimeEnv.from_env(), owner=args.chown)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from kernelbake.runtime.serve.start import serve

    return serve(RuntimeEnv.from_env(), list(args.engine_args))


def cmd_check(args: argparse.Namespace) -> int:
    from kernelbake.runtime.env import VerifyMode
    from kernelbake.runtime.redact import Redactor
    from kernelbake.runtime.serve.check import default_log, run_check

    env = RuntimeEnv.from_env()
    if args.unsafe_size_only:
        env = dataclasses.replace(env, verify=VerifyMode.UNSAFE_SIZE_ONLY)
    user_args = list(args.engine_args)
    log = None if args.verbose else (args.log or default_log(env))

    def say(text: str) -> None:
        print(f"kernelbake check: {text}", file=sys.stderr, flush=True)

    result = run_check(env, user_args, log=log, say=say)
    asked = result.verdict.prediction
    if args.identity_out and asked is not None and asked.identity is not None:
        args.identity_out.write_text(json.dumps(asked.identity, indent=1, sort_keys=True) + "\n")
    redact = Redactor.for_run(result.verdict.env, user_args)
    if args.json:
        print(redact(json.dumps(result.to_json(), indent=2)))
    else:
        for line in _check_lines(result, chosen_log=args.log is not None):
            print(redact(line))
    return result.exit_code


# The default log lies in the container's scratch directory, which `docker run --rm` removes with
# the container: say so where its path is printed, with the two ways to see it.
_LOG_GOES = "in the scratch directory, gone with a --rm container: -v prints it here, --log FILE on a mounted path keeps it"


def _check_lines(result: CheckResult, *, chosen_log: bool = False) -> list[str]:
    """The verdict first (the word, this machine, what differs, what was asked), then the
    details: the key and the files, the warnings, the prediction per cache kind."""
    v = result.verdict
    found = v.platform.fields()
    engine = v.target.key.engine.value
    software = [f"{engine} {found['engine_version']}"] if engine != "torch" else []
    software += [f"{name} {found[name]}" for name in ("torch", "triton", "flashinfer", "python")]
    lines = [
        f"{result.outcome.value}: {_outcome_said(result)} (exit {result.exit_code})",
        f"this machine: {found['device']} ({found['arch']}), driver {found['driver']}, CUDA {found['cuda']}; "
        + ", ".join(software),
    ]
    if differs := result.differs:
        lines.append("differs (baked → this start):" if v.warm else "why:")
        lines += [f"  - {d}" for d in differs]
    lines += _asked_lines(result, chosen_log)
    lines.append("details:")
    if v.warm:
        lines.append(
            f"  baked caches in use: key {v.target.key.digest} ({v.match.summary()} with this machine); "
            f"{v.integrity}; engine caches at {v.cache_root}"
        )
    else:
        lines.append(f"  key {v.target.key.digest}; a fresh cache directory for this start: {v.cache_root}")
    lines += [f"  WARNING: {n}" for n in v.notes]
    lines += [f"  {line}" for line in (v.prediction.lines() if v.prediction else [])]
    return lines


def _outcome_said(result: CheckResult) -> str:
    """What the outcome means for this start, in words."""
    from kernelbake.runtime.serve.check import Outcome

    v, outcome = result.verdict, result.outcome
    if not v.warm:
        return "starting COLD; the baked caches are not used"
    if outcome is Outcome.HIT:
        return "nothing compiles at start" + {
            "retrace": "; the model is traced again",
            "writes": "; a knob outside the cache keys writes files into the caches",
        }.get(v.predicted, "")
    if outcome is Outcome.NO_COMPILE:
        return "compilation is off for this start: nothing compiles, and the compile caches are not read"
    if outcome is Outcome.MISS:
        return "kernels compile at start" + (
            " (a cache is switched off)" if v.predicted == "bypassed" else ""
        )
    if outcome is Outcome.FAILS:
        return "the engine refuses these settings and will not start (see differs)"
    note = v.prediction.note if v.prediction is not None else ""
    return f"no verdict from the engine{f' ({note})' if note else ''}; not a hit"


def _asked_lines(result: CheckResult, chosen_log: bool) -> list[str]:
    """Whether the engine was asked, how long it took and where its output is."""
    if (a := result.asked) is None:
        lines = ["the engine was not asked (the start is cold)"]
        if result.log is not None:
            gone = "" if chosen_log else f" ({_LOG_GOES})"
            lines.append(f"the engine's output while probing this machine: {result.log}{gone}")
        return lines
    said = "its output is above" if a.log is None else f"its output: {a.log}"
    if a.log is not None and not chosen_log:
        said += f" ({_LOG_GOES})"
    answer = "" if a.answered else "; it gave no verdict of its own, so the image key decides"
    return [f"asked {a.engine} in this process ({a.seconds:.1f} s){answer}; {said}"]


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
    from kernelbake.runtime.compile.fetch import fetch_model

    print(f"kernelbake fetch-model: {fetch_model(RuntimeEnv.from_env())}")
    return 0


def cmd_seed_cache(args: argparse.Namespace) -> int:
    from kernelbake.runtime.serve.preflight import seed

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
    p = sub.add_parser("compile", help=IN_IMAGE + "compile and write the cache bundle")
    p.add_argument("--chown", type=_owner, help="give the bundle to UID:GID afterwards (two-phase builds)")
    p.set_defaults(func=cmd_compile)

    serve = sub.add_parser(
        "serve",
        help=IN_IMAGE + "preflight, then exec the engine",
        usage="kernelbake serve [ENGINE ARGS...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.set_defaults(func=cmd_serve, passthrough=True)

    p = sub.add_parser(
        "check",
        help=IN_IMAGE + "preflight only: would serve start warm?",
        usage="kernelbake check [--json] [-v | --log FILE] [--unsafe-size-only] [--identity-out FILE] "
        "[SERVE ARGS...]",
    )
    p.add_argument("--json", action="store_true", help="the verdict and its details as one JSON document")
    output = p.add_mutually_exclusive_group()
    output.add_argument(
        "-v",
        action="store_true",
        dest="verbose",
        help="show the engine's own output (its log lines and warnings) on stderr",
    )
    output.add_argument(
        "--log",
        type=Path,
        metavar="FILE",
        help="append the engine's output to FILE (default: a new kernelbake-check-*.log in the scratch directory)",
    )
    p.add_argument(
        "--unsafe-size-only",
        action="store_true",
        help="compare cache file sizes only, not every file's sha256 (a same-size change passes)",
    )
    p.add_argument(
        "--identity-out",
        type=Path,
        metavar="FILE",
        help="write the engine's cache identity now (to diff against the manifest's)",
    )
    p.set_defaults(func=cmd_check, passthrough=True)

    p = sub.add_parser(
        "engine-command", help=IN_IMAGE + "the engine command and variables serve uses, as JSON"
    )
    p.set_defaults(func=cmd_engine_command)

    p = sub.add_parser("fetch-model", help=IN_IMAGE + "download config/tokenizer files")
    p.set_defaults(func=cmd_fetch_model)

    p = sub.add_parser("seed-cache", help=IN_IMAGE + "copy the baked caches to DEST")
    p.add_argument("dest", type=Path)
    p.set_defaults(func=cmd_seed_cache)

    # capture's collect runs in the image; its push and verify import host code only when run.
    from kernelbake.cli import capture

    capture.register(sub)
    # snapshot's take runs in the image; its push and verify import host code only when run.
    from kernelbake.cli import snapshot

    snapshot.register(sub)
    serve.epilog = _image_commands(sub, exclude="serve")


def _image_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser], *, exclude: str) -> str:
    """What ``docker run IMAGE --help`` (the entrypoint is ``kernelbake serve``) shows after the
    usage: the image's other commands, from the parsers registered here, so it cannot drift."""
    rows = [
        (a.dest, str(a.help).removeprefix(IN_IMAGE))
        for a in sub._choices_actions
        if a.dest != exclude and str(a.help).startswith(IN_IMAGE)
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(
        [
            "serve runs the preflight, then execs the engine with every option it was given (the",
            "model is baked in). The image's other commands, as docker run IMAGE COMMAND [ARGS...]:",
            *(f"  {name:<{width}}  {text}" for name, text in rows),
            "Each takes --help.",
        ]
    )
