"""Every guide is a runbook that this test runs (issue 44): the shell blocks of each page in
tests/support/runbook.PAGES, verbatim and in page order, on the CPU default image, with the
output the page shows checked. A block that needs what CI lacks is marked so on the page and
named in this test's output (``-rA`` or the failure), never dropped silently.

Each page starts where a new user starts after set-up: a checkout (the repository's files, copied
into a fresh directory so that what a page writes, e.g. ``build/``, stays there), the README's PATH
line, and what ``make image`` leaves: ``build/image.ref`` naming the pushed image and a signing
key in ``build/signing`` that signed it. The image is the integration fixtures' ``vllm_image``
(the same spec, plan and build driver as ``make image``), so no image is built again here; the
key is made and the image signed as ``make image`` does (``kernelbake sign --legacy``)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from kernelbake.pipeline import Built
from tests.conftest import REPO
from tests.support import runbook

# cosign: docs/signing.md runs cosign 2 and cosign 3 (make signing-deps installs both).
pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.cosign, pytest.mark.slow]

# What a page may leave on the daemon when a block fails half-way, by the names the pages use
# (the images it pulls are under the test registry's address, whose teardown removes them).
VOLUMES = ("kb-cache",)
CONTAINERS = ("kb-replica", "kb-replica-2", "kb-delta", "kb-restored")
LEFT_OUT = {".git", "build", ".venv", ".cache", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


# Linked rather than copied: large, and no page writes into them or names a path through them.
LINKED = {"bench", "node_modules"}
CACHES = shutil.ignore_patterns("__pycache__", "node_modules", ".mypy_cache", ".ruff_cache", ".pytest_cache")


def _ignored(paths: Iterable[str], *, tracked_too: bool = False) -> set[str]:
    """Those of ``paths`` (relative to the repository) its .gitignore ignores; with
    ``tracked_too``, also those it would ignore were they not tracked (``--no-index``)."""
    flags = ["--no-index"] if tracked_too else []
    done = subprocess.run(
        ["git", "-C", str(REPO), "check-ignore", *flags, "--stdin"],
        input="\n".join(sorted(paths)) + "\n", capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr  # 1: none ignored
    return set(done.stdout.splitlines())


def _checkout(where: Path) -> Path:
    # Copied, not linked: a relative path through a link (local-policy.yaml's
    # ../../build/signing) would resolve into this repository's build/, not the page's.
    where.mkdir()
    # A developer's .gpu/ bundle of wheels is GBs; a clone has none of what git ignores.
    ignored = _ignored(e.name for e in REPO.iterdir()) - LINKED
    for entry in REPO.iterdir():
        if entry.name in LEFT_OUT or entry.name in ignored or entry.name.endswith("_cache"):
            continue
        if entry.name in LINKED:
            (where / entry.name).symlink_to(entry)
        elif entry.is_dir():
            shutil.copytree(entry, where / entry.name, symlinks=True, ignore=CACHES)
        else:
            shutil.copy2(entry, where / entry.name)
    # The venv that runs these tests is the checkout's (make deps made it).
    (where / ".venv").symlink_to(Path(sys.prefix))
    return where


@pytest.fixture
def after_make_image(vllm_image: Built, tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    assert vllm_image.pushed is not None
    checkout = _checkout(tmp_path / "checkout")
    env = runbook.page_env(checkout / ".venv" / "bin", {})
    (checkout / "build").mkdir()
    (checkout / "build" / "image.ref").write_text(vllm_image.pushed + "\n")
    for argv in (
        ["kernelbake", "generate-key-pair", "--dir", "build/signing"],
        ["kernelbake", "sign", "--key", "build/signing/kernelbake.key", "--legacy", vllm_image.pushed],
    ):
        done = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
    try:
        yield checkout, env
    finally:
        subprocess.run(["docker", "rm", "-f", *CONTAINERS], capture_output=True, check=False)
        for volume in VOLUMES:
            subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True, check=False)
        # What a page wrote under build/ (a snapshot's GBs among it) is not kept for the rest of
        # the run: CI's disk had 7.6 GB free near its end.
        shutil.rmtree(checkout / "build", ignore_errors=True)


def _files(root: Path) -> set[str]:
    """Every file under ``root``, relative to it, not following links (the venv, bench/)."""
    return {str((Path(d) / f).relative_to(root)) for d, _, files in os.walk(root) for f in files}


def _committable(paths: set[str]) -> list[str]:
    """The paths this repository's .gitignore does not ignore: a ``git add -A`` would take them."""
    return sorted(paths - _ignored(paths, tracked_too=True)) if paths else []


@pytest.mark.parametrize("page", runbook.PAGES)
def test_the_guide_runs_as_written(page: str, after_make_image: tuple[Path, dict[str, str]]) -> None:
    checkout, env = after_make_image
    blocks = runbook.parse((REPO / page).read_text(), page)
    before = _files(checkout)
    # Above the pages' own waits (a replica's /health, 900 s), so that those name what failed.
    report = runbook.run(blocks, env=env, cwd=checkout, timeout=1800)
    # What ran and what did not, by line: -rA shows it, and so does a failure.
    print("\n".join(report.lines()))
    assert report.ran, page
    # What a page writes goes where git ignores it (build/): its keys and certificates included.
    assert _committable(_files(checkout) - before) == [], page


ADMISSION = "docs/admission.md"
ADMISSION_PORT = 8443  # the page's: make admission-serve listens there
CERTS = Path("build/admission/certs")


def _admission_healthy(checkout: Path, server: subprocess.Popen[bytes], log: Path) -> None:
    """The page's server answers /healthz to the client certificate it made (within 120 s)."""
    probe = [
        "curl", "-sf", "--cacert", str(CERTS / "ca.crt"), "--cert", str(CERTS / "client.crt"),
        "--key", str(CERTS / "client.key"), f"https://127.0.0.1:{ADMISSION_PORT}/healthz",
    ]  # fmt: skip
    deadline = time.monotonic() + 120
    while subprocess.run(probe, cwd=checkout, capture_output=True, check=False).returncode != 0:
        if server.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"make admission-serve did not answer /healthz:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)


def test_the_admission_page_runs_with_its_server(after_make_image: tuple[Path, dict[str, str]]) -> None:
    """docs/admission.md with the server it starts held as another terminal would hold it (its
    own session, stopped after), and the request the page sends it run too, its answer checked
    against the page: the blocks test_the_guide_runs_as_written leaves out."""
    checkout, env = after_make_image
    blocks = runbook.parse((REPO / ADMISSION).read_text(), ADMISSION)
    (server,) = [b for b in blocks if b.kind is runbook.Kind.SERVER]
    (client,) = [b for b in blocks if b.kind is runbook.Kind.ELSEWHERE and b.needs == "test_runbooks"]
    at = blocks.index(server)
    before, after = (
        blocks[:at],
        [dataclasses.replace(b, kind=runbook.Kind.RUN) if b is client else b for b in blocks[at + 1 :]],
    )
    assert runbook.run(before, env=env, cwd=checkout, timeout=600).ran
    log = checkout / "build" / "admission-serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-e", "-c", server.body], cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        _admission_healthy(checkout, proc, log)
        report = runbook.run(after, env=env, cwd=checkout, timeout=120)
        assert client.line in [b.line for b in report.ran] and report.checked, report.lines()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    said = log.read_text()
    assert "kernelbake admission: listening on https://127.0.0.1:8443" in said, said
