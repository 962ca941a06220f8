"""bench/criu_log.py: a CRIU -v4 log's longest waits and its time split by the work a wait
follows, on logs whose stamps are known."""

from __future__ import annotations

from tests.support import bench

criu_log = bench.load("criu_log")


def test_a_criu_restore_s_time_is_split_by_the_work_each_wait_follows() -> None:
    # Two processes' lines interleave, as in the 8B's log: a wait counts for the line before it.
    log = (
        "(00.000000) Restoring task 1\n"
        "(00.400000)   11: Opening 0x007f52d1b28000-0x007f52d1b2e000 0000000000000000 (20000041) vma\n"
        "(01.400000)   12: Opening 0x007f52d1b2e000-0x007f52d1c89000 0x00000000006000 (20000041) vma\n"
        "(01.500000) pie: 12: Preadv 0x5c883000:8192... (1023 iovs)\n"
        "(03.500000) pie: 12: `- returned 2074308608\n"
        "(03.600000) pie: 11: Preadv 0x31a6e000:8138752... (1023 iovs)\n"
        "not stamped: passed over\n"
        "(04.100000) Opening /usr/lib/libc.so.6, not a mapping's line\n"
        "(04.200000) Restore finished\n"
    )
    split = criu_log.criu_time_by_work(log)
    assert split == {
        "other": {"lines": 4, "waited_s": 0.6, "first_s": 0.0, "last_s": 4.2},
        "opening file mappings": {"lines": 2, "waited_s": 1.1, "first_s": 0.4, "last_s": 1.4},
        "reading pages": {"lines": 2, "waited_s": 2.5, "first_s": 1.5, "last_s": 3.6},
    }
    assert round(sum(row["waited_s"] for row in split.values()), 6) == 4.2
    assert criu_log.criu_time_by_work("") == {}
