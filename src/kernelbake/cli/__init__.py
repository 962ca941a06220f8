"""``kernelbake`` command line. Each area registers its subcommands from its own module;
``main`` is the one place that turns a ``KernelbakeError`` into one line and an exit code."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence

from kernelbake import __version__
from kernelbake.errors import EnvironmentProblem, KernelbakeError

# Modules with ``register(subparsers)``; each sets ``func(args) -> int`` on its parsers.
_AREAS = (
    "kernelbake.cli.planning",
    "kernelbake.cli.building",
    "kernelbake.cli.runtime",
    "kernelbake.cli.signing",
    "kernelbake.cli.admission",
    "kernelbake.cli.fleet",
)


# The commands that run inside images, on every replica's start path: they build a parser of
# their own area only, so ``serve`` does not import the host's planning, rendering and
# signing code (jinja2, asyncio, importlib.metadata: ~0.1 s of a start that vLLM waits on).
_IN_IMAGE = {
    "compile": "kernelbake.cli.runtime",
    "serve": "kernelbake.cli.runtime",
    "check": "kernelbake.cli.runtime",
    "fetch-model": "kernelbake.cli.runtime",
    "seed-cache": "kernelbake.cli.runtime",
    "engine-command": "kernelbake.cli.runtime",
    # ``capture collect`` runs in the replica; ``push`` and ``verify`` import host code lazily.
    "capture": "kernelbake.cli.runtime",
    # ``snapshot take`` runs in the image; ``push`` and ``verify`` import host code lazily.
    "snapshot": "kernelbake.cli.runtime",
}


def build_parser(areas: Sequence[str] = _AREAS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernelbake", description="Bake compiled kernels into serving images."
    )
    parser.add_argument("--version", action="version", version=f"kernelbake {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for area in areas:
        importlib.import_module(area).register(sub)
    return parser


class _Refused(Exception):
    """A command line ``main`` refuses before parsing (exit 2, as argparse does)."""


def image_command(words: Sequence[str]) -> list[str]:
    """The command line an image's entrypoint (``kernelbake serve``) really means.

    ``docker run IMAGE check --json`` arrives as ``serve check --json``: a kernelbake command
    first (optionally after ``kernelbake``) runs that command. Any other word that is not an
    option would reach the engine as a positional argument, which vLLM takes as the model
    and then serves forever; the model is baked in, so that is refused."""
    if words[:1] != ["serve"] or len(words) < 2 or words[1].startswith("-"):
        return list(words)
    rest = list(words[1:])
    if rest[0] == "kernelbake" and len(rest) > 1:
        rest = rest[1:]
    if rest[0] in _IN_IMAGE:
        return rest
    commands = ", ".join(sorted(_IN_IMAGE))
    raise _Refused(
        f"kernelbake serve: error: {rest[0]!r} is neither an option nor a command of the image "
        f"({commands}); the model is baked in, so serve takes options only "
        "(docker run IMAGE check --json, or docker run IMAGE --max-num-seqs 8)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        words = image_command(sys.argv[1:] if argv is None else list(argv))
    except _Refused as exc:
        print(exc, file=sys.stderr)
        return 2
    area = _IN_IMAGE.get(words[0]) if words else None
    parser = build_parser((area,) if area else _AREAS)
    # ``serve`` and ``check`` pass whatever they do not know to the engine, options included.
    args, extra = parser.parse_known_args(words)
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "passthrough", False):
        args.engine_args = extra[1:] if extra[:1] == ["--"] else extra
    try:
        rc: int = args.func(args)
        # Flushed here, so that a reader that went away is seen below and not at exit.
        sys.stdout.flush()
        return rc
    except KernelbakeError as exc:
        print(f"kernelbake {args.command}: error: {exc}", file=sys.stderr)
        return exc.return_code
    except KeyboardInterrupt:
        print(f"kernelbake {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_gone()
    except OSError as exc:
        # What the machine refused where no module said it in its own words (a disk that filled
        # while a snapshot was pushed, 2026-12-06): said, never a traceback.
        print(f"kernelbake {args.command}: error: {exc}", file=sys.stderr)
        return EnvironmentProblem.return_code


# What a shell reports for a tool that SIGPIPE ended (``yes | head -1``: 128 + 13).
EXIT_BROKEN_PIPE = 141


def _reader_gone() -> int:
    """The reader of our output went away (``kernelbake plan --print | head -1``): stop quietly,
    as Unix tools do. Python's documentation (signal, "Note on SIGPIPE") points stdout at
    /dev/null, so that flushing it again at exit does not fail a second time; the status is the
    one a shell gives a tool that SIGPIPE killed, so ``set -o pipefail`` still sees it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # not a real file (captured in tests)
            os.dup2(devnull, stream.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE
