"""The Makefile says what it does: `make help` names every target, and `make verify` with
nothing built says what to do instead of printing a bare usage line. Only targets that
change nothing run here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

MAKEFILES = [REPO / "Makefile", *sorted((REPO / "mk").glob("*.mk"))]


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _targets() -> set[str]:
    """Every target a rule names in the Makefile and mk/*.mk (not variables, not file targets)."""
    rule = re.compile(r"^([a-z][a-z0-9-]*)\s*:(?!=)")
    found = set()
    for path in MAKEFILES:
        for line in path.read_text().splitlines():
            if m := rule.match(line):
                found.add(m.group(1))
    return found


def test_make_help_lists_every_target_once_with_a_line_saying_what_it_does() -> None:
    res = _make("help")
    assert res.returncode == 0, res.stderr
    listed = [line.split(None, 1) for line in res.stdout.splitlines()[1:]]
    names = [row[0] for row in listed]
    assert all(len(row) == 2 and row[1].strip() for row in listed), listed
    assert len(names) == len(set(names)), names
    targets = _targets()
    assert len(targets) > 20  # the parse found the rules
    assert set(names) == targets, (sorted(targets - set(names)), sorted(set(names) - targets))


def test_make_verify_with_nothing_built_says_so_in_one_line(tmp_path: Path) -> None:
    res = _make("verify", f"BUILD={tmp_path}")
    assert res.returncode == 2
    assert res.stdout == ""
    (line,) = res.stderr.splitlines()
    assert f"verify: nothing was built ({tmp_path}/image.ref is missing or empty)" in line
    assert "run make image, or pass IMAGE=" in line


def test_make_verify_reads_the_reference_make_image_wrote(tmp_path: Path) -> None:
    ref = "127.0.0.1:5000/kernelbake/tiny-llama@sha256:" + "ab" * 32
    (tmp_path / "image.ref").write_text(ref + "\n")
    res = _make("-n", "verify", f"BUILD={tmp_path}")
    assert res.returncode == 0, res.stderr
    assert f"kernelbake verify {ref} --key" in res.stdout


def test_an_unknown_model_lists_the_specs_in_one_line() -> None:
    res = _make("-n", "image", "MODEL=does-not-exist")
    assert res.returncode == 2, res
    (line,) = res.stderr.splitlines()
    assert "awk" not in line and "No rule" not in line, line
    assert "MODEL=does-not-exist: there is no images/does-not-exist.yaml" in line
    specs = sorted(p.stem for p in (REPO / "images").glob("*.yaml"))
    assert f"the specs in images/: {' '.join(specs)}" in line
    # Targets that take no MODEL still work with any.
    assert _make("help", "MODEL=does-not-exist").returncode == 0


def test_make_help_starts_every_description_in_one_column() -> None:
    rows = _make("help").stdout.splitlines()[1:]
    names = [row.split(None, 1)[0] for row in rows]
    column = max(len(n) for n in names) + 4
    assert all(row[column - 2 : column] == "  " and row[column] != " " for row in rows), rows


def test_a_failed_build_keeps_the_last_builds_output_and_reference(tmp_path: Path) -> None:
    (tmp_path / "image.out").write_text(
        "pushed\t127.0.0.1:5000/kernelbake/tiny-llama@sha256:" + "ab" * 32 + "\n"
    )
    (tmp_path / "image.ref").write_text("127.0.0.1:5000/kernelbake/tiny-llama@sha256:" + "ab" * 32 + "\n")
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    # A build that prints a line and fails, in place of kernelbake build.
    fake = tmp_path / "fake-kb"
    fake.write_text("#!/bin/sh\necho 'building…'\nexit 4\n")
    fake.chmod(0o755)
    res = _make("build-image", f"BUILD={tmp_path}", f"KB={fake}")
    assert res.returncode != 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir() if p.name in before} == before
    assert (tmp_path / "image.out.failed").read_text() == "building…\n"


IMG = "127.0.0.1:5000/kernelbake/tiny-llama"
H100, H200 = f"{IMG}@sha256:{'a1' * 32}", f"{IMG}@sha256:{'a2' * 32}"
CACHE = f"{IMG}@sha256:{'c1' * 32}"
INDEX = f"{IMG}:vllm0.32.0-gpus-1a2b3c4d@sha256:{'e1' * 32}"


def _build_printing(tmp_path: Path, printed: str) -> subprocess.CompletedProcess[str]:
    """``make build-image`` with a stand-in for kernelbake build that prints ``printed``."""
    fake = tmp_path / "fake-kb"
    fake.write_text(f"#!/bin/sh\nprintf '{printed}'\n")
    fake.chmod(0o755)
    return _make("build-image", f"BUILD={tmp_path}", f"KB={fake}")


@pytest.mark.parametrize(
    ("printed", "image_ref", "index_ref"),
    [
        # One image: it, and no index.
        (f"built\\t{IMG}:t\\npushed\\t{H100}\\n", H100, None),
        # --publish both on one target (the CPU default): the image to run, and the index that
        # lists it with its cache artifact (it was the index, a "gpus" tag, for a CPU build).
        (f"pushed\\t{H100}\\ncache\\t{CACHE}\\nindex\\t{INDEX}\\n", H100, INDEX),
        # Several GPUs: no one image, so the index is both.
        (f"pushed\\t{H100}\\npushed\\t{H200}\\nindex\\t{INDEX}\\n", INDEX, INDEX),
    ],
)
def test_build_image_writes_the_image_to_run_and_the_index_apart(
    tmp_path: Path, printed: str, image_ref: str, index_ref: str | None
) -> None:
    (tmp_path / "index.ref").write_text("a stale index of the build before\n")
    res = _build_printing(tmp_path, printed)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "image.ref").read_text() == image_ref + "\n"
    if index_ref is None:
        assert not (tmp_path / "index.ref").exists()
    else:
        assert (tmp_path / "index.ref").read_text() == index_ref + "\n"


@pytest.mark.parametrize("index", [True, False])
def test_sign_built_signs_the_index_when_there_is_one_else_the_image(tmp_path: Path, index: bool) -> None:
    (tmp_path / "image.ref").write_text(H100 + "\n")
    if index:
        (tmp_path / "index.ref").write_text(INDEX + "\n")
    res = _make("-n", "sign-built", f"BUILD={tmp_path}", f"SIGNING_KEY={tmp_path}/k.key")
    assert res.returncode == 0, res.stderr
    (line,) = [ln for ln in res.stdout.splitlines() if "kernelbake sign " in ln]
    assert line.endswith(f" {INDEX if index else H100}"), line
