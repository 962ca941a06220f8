"""The pod walk's path test (``pod.under``): its shortcut for paths that cannot resolve under the
root answers as resolving them does; so do ``pod.normal``'s for paths already normal, and
``workloads.pointer``'s for segments with nothing to escape."""

from __future__ import annotations

import posixpath

from hypothesis import given
from hypothesis import strategies as st

from kernelbake.admission.pod import normal, under
from kernelbake.admission.workloads import pointer
from kernelbake.contract.delta import DELTA_ROOT
from kernelbake.contract.layout import CACHE_ROOT
from kernelbake.contract.snapshot import SNAPSHOT_ROOT

ROOTS = (SNAPSHOT_ROOT, DELTA_ROOT, CACHE_ROOT, "/opt/kernelbake", "/")
PARTS = ["", ".", "..", "opt", "kernelbake", "snapshot", "snapshots", "delta", "cache", "x", "Snapshot"]
# Names that start or end with dots, and the separators and escapes a pointer segment may hold.
ODD = [".x", "x.", "...", "~", "a~b", "/", "a/b", "~1", " "]


def resolved_under(path: str, root: str) -> bool:
    """The definition, resolving every path (``/`` itself is under ``/``; nothing else is)."""
    resolved = "/" + posixpath.normpath("/" + path).lstrip("/")
    return resolved == root or resolved.startswith(root + "/")


@given(st.lists(st.sampled_from(PARTS), max_size=9), st.booleans(), st.sampled_from(ROOTS))
def test_under_answers_as_resolving_the_path_does(parts: list[str], absolute: bool, root: str) -> None:
    path = ("/" if absolute else "") + "/".join(parts)
    assert under(path, root) == resolved_under(path, root), path


def test_paths_that_resolve_under_the_root_in_roundabout_ways() -> None:
    for path in (
        "/opt/kernelbake/./snapshot",
        "/opt//kernelbake/snapshot/",
        "/x/../opt/kernelbake/snapshot/y",
        "opt/kernelbake/snapshot",
        "/../opt/kernelbake/snapshot",
    ):
        assert under(path, SNAPSHOT_ROOT), path
    assert not under("/opt/kernelbake/snapshots", SNAPSHOT_ROOT)
    assert not under("/opt/kernelbake/snapshot/..", SNAPSHOT_ROOT)
    assert under("/anything/..", "/")


@given(
    st.lists(st.sampled_from(PARTS + ODD), max_size=9),
    st.sampled_from(["", "/", "//"]),
    st.sampled_from(["", "/"]),
)
def test_normal_answers_as_normpath_does(parts: list[str], lead: str, tail: str) -> None:
    path = lead + "/".join(parts) + tail
    assert normal(path) == "/" + posixpath.normpath("/" + path).lstrip("/"), path


@given(st.lists(st.sampled_from(PARTS + ODD), max_size=6))
def test_pointer_escapes_as_rfc_6901_does(parts: list[str]) -> None:
    assert pointer(parts) == "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts), parts
    assert pointer(tuple(parts)) == pointer(parts)
