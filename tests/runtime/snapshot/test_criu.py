"""What a failed CRIU run is reported as: its own first errors, read from its log."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from kernelbake.runner import Result
from kernelbake.runtime.snapshot.criu import Criu, failure

# The shape of a real failed dump's log (-v4): info lines, a warning, the cause, the unwinding.
DUMP_LOG = """\
(00.000000) Version: 4.2.1 (gitid 0)
(00.004113) Warn  (criu/kerndat.c:1180): Dirty tracking is OFF. Memory snapshot will not work.
(02.517210) Error (criu/sk-unix.c:1004): unix: Can't dump socket 12345 of unknown state
(02.517300) Error (criu/files.c:502): Can't dump file 17 of that type [0x1f]
(02.517400) Error (criu/cr-dump.c:1690): Dump files (pid: 6394) failed with -1
(02.520000) Error (criu/cr-dump.c:2110): Dumping FAILED.
"""


def test_a_failed_dump_says_criu_s_first_errors_and_where_its_log_is(tmp_path: Path) -> None:
    def runner(argv: Any, **_: Any) -> Result:
        log = Path(argv[argv.index("-o") + 1])
        log.write_text(DUMP_LOG)
        return Result(tuple(argv), 1)

    ok, log = Criu(tmp_path / "criu", runner=runner).dump(6394, tmp_path / "images", tmp_path)
    assert not ok
    assert failure(Path(log)) == (
        "unix: Can't dump socket 12345 of unknown state; Can't dump file 17 of that type [0x1f]; "
        f"Dump files (pid: 6394) failed with -1 (the whole log: {log})"
    )


def test_an_error_line_is_cut_and_a_log_without_errors_gives_its_last_line(tmp_path: Path) -> None:
    log = tmp_path / "restore.log"
    log.write_text("(00.1) Error (criu/x.c:1): " + "x" * 5000 + "\n")
    assert failure(log) == "x" * 200 + f" (the whole log: {log})"
    log.write_text("(00.1) Warn  (criu/x.c:1): something\n(00.2) Killed by signal 9\n\n")
    assert failure(log) == f"(00.2) Killed by signal 9 (the whole log: {log})"
    log.write_text("")
    assert failure(log) == f"the log is empty (the whole log: {log})"


def test_a_log_that_cannot_be_read_is_said_so(tmp_path: Path) -> None:
    # None written: CRIU stopped on its first check (without SYS_ADMIN), saying why on stderr.
    assert failure(tmp_path / "gone" / "dump.log") == (
        f"CRIU stopped before it wrote its log {tmp_path / 'gone' / 'dump.log'}; what it printed is above"
    )
    (tmp_path / "dir.log").mkdir()
    assert failure(tmp_path / "dir.log").startswith(f"its log {tmp_path / 'dir.log'} could not be read (")


# `criu check --all` in a fresh container of the CPU image, first and second run (2026-12-05).
CHECK_FIRST = """\
Warn  (criu/kerndat.c:1290): Can't keep kdat cache on non-tempfs
Warn  (criu/cr-check.c:824): Dirty tracking is OFF. Memory snapshot will not work.
Error (criu/cr-check.c:1007): failed to mount autofs: No such device
Looks good but some kernel features are missing
which, depending on your process tree, may cause
dump or restore failure.
"""
CHECK_LATER = "\n".join(line for line in CHECK_FIRST.splitlines() if "kerndat" not in line) + "\n"


def test_the_features_in_the_key_are_the_feature_checks_alone(tmp_path: Path) -> None:
    """The first CRIU run in a container also warns that it cannot keep its kdat cache, and later
    runs do not: a take and a restore on the same machine must still record the same features."""
    outputs = iter([CHECK_FIRST, CHECK_LATER])
    criu = Criu(tmp_path / "criu", runner=lambda argv, **_: Result(tuple(argv), 0, "", next(outputs)))
    first, later = criu.features(), criu.features()
    assert (
        first
        == later
        == ("Dirty tracking is OFF. Memory snapshot will not work. | failed to mount autofs: No such device")
    )
    nothing = Criu(tmp_path / "criu", runner=lambda argv, **_: Result(tuple(argv), 0, "Looks good.\n", ""))
    assert nothing.features() == "none"


def test_hard_limits_are_read_by_name_for_this_process_or_another() -> None:
    import os
    import resource

    from kernelbake.contract.snapshot import UNLIMITED
    from kernelbake.runtime.snapshot.machine import hard_rlimits

    mine = hard_rlimits()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert mine["NOFILE"] == (UNLIMITED if hard == resource.RLIM_INFINITY else hard)
    assert "OFILE" not in mine and {"NPROC", "STACK", "MEMLOCK"} <= set(mine)
    assert hard_rlimits(os.getpid()) == mine


def test_cap_sys_resource_is_read_from_capeff(tmp_path: Path) -> None:
    from kernelbake.runtime.snapshot.machine import may_raise_rlimits

    status = tmp_path / "status"
    for capeff, holds in (
        ("00000000a80425fb", False),
        ("000001ffffffffff", True),
        ("0000000001000000", True),
    ):
        status.write_text(f"Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t{capeff}\n")
        assert may_raise_rlimits(status) is holds, capeff
    assert may_raise_rlimits(tmp_path / "missing") is False


def test_a_restore_that_runs_past_its_timeout_is_ended_and_says_so(tmp_path: Path) -> None:
    from kernelbake.runtime.snapshot.criu import Criu, RestoreTimedOut

    binary = tmp_path / "criu"
    binary.write_text(
        "#!/bin/sh\necho '(00.7) pie: 9: Error (criu/pie/restorer.c:820): BUG' > \"$8\"\nexec sleep 30\n"
    )
    binary.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(RestoreTimedOut, match=r"did not finish within 1 s: .*BUG.*the whole log"):
        Criu(binary).restore(tmp_path / "images", tmp_path, tmp_path / "root.pid", timeout=1.0)
    assert time.monotonic() - started < 10


def test_a_missing_criu_is_not_reported_as_a_timeout(tmp_path: Path) -> None:
    from kernelbake.errors import EnvironmentProblem
    from kernelbake.runtime.snapshot.criu import Criu, RestoreTimedOut

    with pytest.raises(EnvironmentProblem, match="command not found") as caught:
        Criu(tmp_path / "no-criu").restore(tmp_path / "images", tmp_path, tmp_path / "root.pid", timeout=5.0)
    assert not isinstance(caught.value, RestoreTimedOut)
