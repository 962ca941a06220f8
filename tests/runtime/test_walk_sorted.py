"""``integrity.walk_sorted``: the walk the preflight's stranger check and ``capture collect`` share."""

from __future__ import annotations

from pathlib import Path

from kernelbake.runtime.integrity import walk_sorted


def test_entries_come_top_down_each_directory_sorted_and_a_removed_one_is_skipped(tmp_path: Path) -> None:
    for rel in ("b/z", "b/a", "a/x", "c"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "b")
    seen = []
    for path, rel, dirs in walk_sorted(tmp_path):
        assert path == tmp_path / rel
        seen.append(rel)
        if rel == "a":
            dirs.remove(path.name)
    # "a" is left out as asked; "link" is listed, never followed.
    assert seen == ["a", "b", "c", "link", "b/a", "b/z"]
