"""What a build shows without a terminal while a command is quiet: a line every ``every``
seconds of quiet, with the layers a push has up. Clock injected; nothing waits."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kernelbake.pipeline import BuildOptions, Driver
from kernelbake.plan import BuildTarget, plan
from kernelbake.progress import Progress, PushTally
from kernelbake.settings import Settings
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.support.clock import Clock
from tests.support.recorder import Recorder

# ``docker push`` as it prints without a terminal (no byte counts, a line per state change).
PUSH_START = [
    "The push refers to repository [127.0.0.1:5999/kb/tiny-llama-torch]",
    "5f70bf18a086: Preparing",
    "a3b1c2d4e5f6: Preparing",
    "0123456789ab: Preparing",
    "5f70bf18a086: Waiting",
    "a3b1c2d4e5f6: Layer already exists",
]


def test_the_tally_counts_layers_named_and_up() -> None:
    tally = PushTally()
    notes = [tally(line) for line in PUSH_START]
    assert notes == [None, "0/1 layers", "0/2 layers", "0/3 layers", "0/3 layers", "1/3 layers"]
    assert tally("5f70bf18a086: Pushed\n") == "2/3 layers"
    assert tally("0123456789ab: Mounted from kb/other") == "3/3 layers"
    assert tally("cpu-abc: digest: sha256:" + "ab" * 32 + " size: 1234") is None


def test_a_quiet_push_gets_a_line_every_interval_and_none_while_it_talks() -> None:
    clock, out = Clock(), io.StringIO()
    progress = Progress(["t"], out, live=False, clock=clock, every=15)
    progress.stage("t", "push", "logs/push.log")
    heard = progress.watch("t", PushTally())
    for line in PUSH_START:
        heard(line)
    clock.now += 14
    progress.tick()
    assert "push:" not in out.getvalue()
    clock.now += 1
    progress.tick()
    clock.now += 10
    heard("5f70bf18a086: Pushed")
    clock.now += 14
    # Heard 14 s ago: not quiet long enough.
    progress.tick()
    clock.now += 1
    progress.tick()
    lines = [ln for ln in out.getvalue().splitlines() if ": push:" in ln]
    assert lines == [
        "kernelbake build: t: push: 1/3 layers, 15 s (log logs/push.log)",
        "kernelbake build: t: push: 2/3 layers, 40 s (log logs/push.log)",
    ]


def test_an_unwatched_or_finished_stage_gets_no_line_and_a_terminal_gets_none() -> None:
    clock, out = Clock(), io.StringIO()
    progress = Progress(["a", "b"], out, live=False, clock=clock, every=15)
    progress.stage("a", "compile", "logs/compile.log")
    progress.stage("b", "push", "logs/push.log")
    progress.watch("b", PushTally())
    clock.now += 20
    progress.done("b", "pushed", "repo@sha256:x")
    progress.tick()
    assert ": compile:" not in out.getvalue() and ": push:" not in out.getvalue()
    live = io.StringIO()
    on_tty = Progress(["c"], live, live=True, clock=clock, every=15)
    on_tty.stage("c", "push", "logs/push.log")
    on_tty.watch("c")
    clock.now += 60
    on_tty.tick()
    assert live.getvalue() == ""


@pytest.fixture
def target() -> BuildTarget:
    (t,) = plan(load_spec(REPO / "images" / "tiny-llama-torch.yaml"), ["cpu"], registry="127.0.0.1:5999/kb")
    return t


def test_the_drivers_push_feeds_its_lines_to_the_progress(
    target: BuildTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kernelbake build --push`` without a terminal: docker push's own lines count the
    layers, and a silence of a minute (a big layer uploading) shows as lines."""
    monkeypatch.setattr("kernelbake.oci.RegistryClient.ping", lambda self, ref: None)
    clock = Clock()
    made: list[Progress] = []

    def progress(*args: Any, **kw: Any) -> Progress:
        made.append(Progress(*args, **kw, live=False, clock=clock, every=15))
        return made[-1]

    monkeypatch.setattr("kernelbake.pipeline.Progress", progress)

    class Pushing(Recorder):
        def __call__(self, argv, **kw):  # type: ignore[no-untyped-def]
            on_line: Callable[[str], None] | None = kw.get("on_line")
            if argv[1] == "push":
                assert on_line is not None
                for line in PUSH_START:
                    on_line(line)
                for layer in ("5f70bf18a086", "0123456789ab"):
                    # A layer uploads for 40 s without a word from docker.
                    clock.now += 20
                    made[-1].tick()
                    clock.now += 20
                    made[-1].tick()
                    on_line(f"{layer}: Pushed")
            return super().__call__(argv, **kw)

    stream = io.StringIO()
    driver = Driver(
        Settings.from_env({"PATH": "/usr/bin"}), runner=Pushing(labels=dict(target.labels)), stream=stream
    )
    (built,) = driver.build([target], BuildOptions(out=tmp_path, push=True))
    assert built.pushed is not None
    log = tmp_path / target.name / "logs" / "push.log"
    lines = [ln for ln in stream.getvalue().splitlines() if ": push:" in ln]
    assert lines == [
        f"kernelbake build: {target.name}: push: 1/3 layers, 20 s (log {log})",
        f"kernelbake build: {target.name}: push: 1/3 layers, 40 s (log {log})",
        f"kernelbake build: {target.name}: push: 2/3 layers, 60 s (log {log})",
        f"kernelbake build: {target.name}: push: 2/3 layers, 80 s (log {log})",
    ]
