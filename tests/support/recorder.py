"""A recording runner for the build driver: answers docker commands from a script."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kernelbake.runner import Result

if TYPE_CHECKING:
    from kernelbake.runner import Runner


class Recorder:
    def __init__(
        self,
        *,
        buildx: bool = True,
        fail_bake: str | None = None,
        labels: Mapping[str, str] = {},
        builders: tuple[str, ...] = (),
        contexts: tuple[str, ...] = (),
        labels_by_ref: Mapping[str, Mapping[str, str]] | None = None,
        bake_seconds: float = 0.0,
        stdout_for: Mapping[str, str] | None = None,
    ) -> None:
        # A docker subcommand's words (``image inspect --format {{json .}}``) → what it prints.
        self.stdout_for = dict(stdout_for or {})
        # Names of existing buildx builders (container builders for GPU families).
        self.builders = builders
        # Names of existing docker contexts (other daemons); calls record theirs.
        self.contexts = contexts
        self.labels_by_ref = labels_by_ref
        # How long each bake "runs", so that concurrency shows in timings.
        self.bake_seconds = bake_seconds
        self.context_of: list[str | None] = []
        self.spans: list[tuple[str, float, float]] = []
        self._lock = threading.Lock()
        self.calls: list[tuple[str, ...]] = []
        # Per call, whether the caller asked for signals to be forwarded to the command.
        self.forwarded: list[bool] = []
        # Per call, the working directory it was started in (None: the caller's).
        self.cwd_of: list[Path | None] = []
        self.logs: list[Path] = []
        self.buildx = buildx
        # The bake target whose build fails.
        self.fail_bake = fail_bake
        self.labels = dict(labels)

    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        capture: bool = False,
        log: Path | None = None,
        input: str | None = None,
        timeout: float | None = None,
        on_line: Callable[[str], None] | None = None,
        forward_signals: bool = False,
    ) -> Result:
        """The whole ``Runner`` protocol: ``on_line`` is handed each line the command "printed",
        as the real runner hands it each line of output; there is no process to forward
        signals to, so ``forward_signals`` is only recorded."""
        with self._lock:
            self.forwarded.append(forward_signals)
            self.cwd_of.append(cwd)
        result = self._answer(argv, log)
        if on_line is not None:
            for line in (result.stdout + result.stderr).splitlines():
                on_line(line)
        return result

    def _answer(self, argv: Sequence[str], log: Path | None) -> Result:
        args = self._record(argv)
        if args[:2] == ("context", "inspect"):
            return Result(tuple(argv), 0 if args[2] in self.contexts else 1)
        self._run(argv, args, log)
        bake = args[:2] == ("buildx", "bake")
        if bake and args[-1] == self.fail_bake:
            return Result(tuple(argv), 1, "", "boom")
        if args[:2] == ("buildx", "version"):
            return Result(tuple(argv), 0 if self.buildx else 1)
        if args[:2] == ("buildx", "inspect"):
            return Result(tuple(argv), 0 if args[2] in self.builders else 1)
        if bake and "--metadata-file" in args:
            # A container builder pushing the final image writes its digest there.
            meta = Path(args[args.index("--metadata-file") + 1])
            meta.parent.mkdir(parents=True, exist_ok=True)
            meta.write_text(json.dumps({args[-1]: {"containerimage.digest": "sha256:" + "cd" * 32}}))
        return self._printed(argv, args)

    def _record(self, argv: Sequence[str]) -> tuple[str, ...]:
        """The docker words after ``--context NAME``; the call and its context recorded."""
        args = tuple(argv[1:])
        context = None
        if args[:1] == ("--context",):
            context, args = args[1], args[2:]
        with self._lock:
            self.calls.append(args)
            self.context_of.append(context)
        return args

    def _run(self, argv: Sequence[str], args: tuple[str, ...], log: Path | None) -> None:
        """What running takes: a bake's time (recorded as its span) and the log it writes."""
        if args[:2] == ("buildx", "bake") and self.bake_seconds:
            start = time.monotonic()
            time.sleep(self.bake_seconds)
            with self._lock:
                self.spans.append((args[-1], start, time.monotonic()))
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(" ".join(argv) + "\n")
            self.logs.append(log)

    def _printed(self, argv: Sequence[str], args: tuple[str, ...]) -> Result:
        """A command that succeeds, with what it prints."""
        for words, out in self.stdout_for.items():
            if " ".join(args).startswith(words):
                return Result(tuple(argv), 0, out)
        if args[:1] == ("version",):
            return Result(tuple(argv), 0, "26.1.5\n")
        if args[:2] == ("image", "inspect") and "{{json .Config.Labels}}" in args:
            labels = self.labels if self.labels_by_ref is None else self.labels_by_ref[args[-1]]
            return Result(tuple(argv), 0, json.dumps(dict(labels)))
        if args[:2] == ("image", "inspect") and "{{json .RepoDigests}}" in args:
            repo = args[-1].rsplit(":", 1)[0]
            return Result(tuple(argv), 0, json.dumps([f"{repo}@sha256:{'ab' * 32}"]))
        return Result(tuple(argv), 0)

    def commands(self) -> list[str]:
        return [" ".join(c[:2]) for c in self.calls]


if TYPE_CHECKING:
    # mypy: the recorder stands in wherever a Runner is taken.
    _runner: Runner = Recorder()
