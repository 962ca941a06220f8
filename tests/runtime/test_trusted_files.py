"""What ``serve`` trusts cannot be moved by the pod spec (issue 32, item 4): target.json and the
pinned manifest are read at fixed paths that no variable but the unsafe one moves, and the
baked caches start only while no mount of the pod covers them and they are owned as the
image's files are. Each attack is a tampered bundle with a manifest that matches it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.contract.layout import PINNED_MANIFEST, TARGET_FILE, TRUSTED_FILES
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput
from kernelbake.runtime import trusted
from kernelbake.runtime.compile.stage import run_compile
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.runtime.serve import preflight as pf
from tests.support.fake_engine import FakeEngine, pin_manifest, platform_for
from tests.support.runtime_target import runtime_env as _env
from tests.support.runtime_target import write_target

_MOUNTINFO = (
    "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
    "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
    "45 27 254:0 /var/lib/kubelet/pods/x/volumes/etc-hosts /etc/hosts rw - ext4 /dev/vda rw\n"
)


@pytest.fixture
def target(tmp_path: Path) -> TargetConfig:
    return write_target(tmp_path, "tiny-llama-torch.yaml")


def _tampered_bundle(tmp_path: Path, target: TargetConfig) -> Path:
    """What an attacker mounts: a bundle whose cache file was changed, with a manifest that
    matches it, and that manifest again as the pinned copy beside target.json."""
    run_compile(_env(tmp_path), engine=FakeEngine(platform_for(target.key)))
    root = Path(target.cache_root)
    graph = root / "inductor" / "g0" / "graph.bin"
    graph.write_bytes(b"\x66" * 100)
    doc = json.loads((root / "manifest.json").read_text())
    for f in doc["files"]:
        if f["path"] == "inductor/g0/graph.bin":
            f["sha256"] = hashlib.sha256(graph.read_bytes()).hexdigest()
    (root / "manifest.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    pin_manifest(tmp_path / "target.json")
    return root


def _as_image(tmp_path: Path) -> RuntimeEnv:
    """The environment of a start in an image, its trusted files at ``tmp_path`` (as if that
    were /opt/kernelbake): the checks run, nothing says unsafe."""
    return dataclasses.replace(_env(tmp_path), unsafe_target=False)


class _Files:
    """The probes' view: every path a root-owned directory or file (as in an image) unless the
    test says otherwise, and the mounts of ``mountinfo``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, mountinfo: str = _MOUNTINFO, euid: int = 0) -> None:
        self.mountinfo = mountinfo
        self.owners: dict[str, int] = {}
        self.modes: dict[str, int] = {}
        self.writable: set[str] = set()
        self.euid = euid
        monkeypatch.setattr(trusted, "_mountinfo", lambda: self.mountinfo)
        monkeypatch.setattr(trusted, "_lstat", self.lstat)
        monkeypatch.setattr(trusted, "_euid", lambda: self.euid)
        monkeypatch.setattr(trusted, "_writable", lambda p: p in self.writable)

    def mount(self, path: str | Path) -> None:
        self.mountinfo += (
            f"70 27 254:0 /srv/attack {str(path).replace(' ', chr(92) + '040')} rw - ext4 x rw\n"
        )

    def lstat(self, path: str) -> os.stat_result:
        kind = stat.S_IFREG if path.endswith(".json") else stat.S_IFDIR
        mode = self.modes.get(path, kind | (0o644 if kind == stat.S_IFREG else 0o755))
        return os.stat_result((mode, 1, 1, 1, self.owners.get(path, 0), 0, 10, 0, 0, 0))


# -- KERNELBAKE_TARGET=/evil/target.json ------------------------------------------------------


def test_the_retired_target_variable_no_longer_moves_the_trusted_files(
    tmp_path: Path,
    target: TargetConfig,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The attack: a target.json elsewhere, with a pinned copy that matches its tampered bundle.
    It once started warm; now the variable is refused before anything is read."""
    _tampered_bundle(tmp_path, target)
    monkeypatch.setattr(
        "kernelbake.runtime.serve.preflight.get_engine", lambda _e: FakeEngine(platform_for(target.key))
    )
    monkeypatch.delenv("KERNELBAKE_UNSAFE_TARGET", raising=False)
    monkeypatch.setenv("KERNELBAKE_TARGET", str(tmp_path / "target.json"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    capsys.readouterr()
    assert main(["check"]) == BadInput.return_code
    err = capsys.readouterr().err
    assert f"$KERNELBAKE_TARGET='{tmp_path}/target.json' is no longer read" in err
    assert f"only at their fixed paths in the image ({TARGET_FILE})" in err
    assert "set $KERNELBAKE_UNSAFE_TARGET" in err and "baked caches valid" not in err


def test_the_trusted_files_are_at_fixed_paths_whatever_else_is_set() -> None:
    env = RuntimeEnv.from_env(
        {
            # The fixed path itself is harmless, and was a common explicit setting.
            "KERNELBAKE_TARGET": TARGET_FILE,
            "KERNELBAKE_SCRATCH": "/elsewhere",
            "KERNELBAKE_STATUS": "/elsewhere/status.json",
        }
    )
    assert (str(env.target_file), str(env.pinned_manifest)) == TRUSTED_FILES
    assert TRUSTED_FILES == (TARGET_FILE, PINNED_MANIFEST) and not env.unsafe_target


def test_only_the_unsafe_variable_moves_them_and_every_verdict_says_so(
    tmp_path: Path, target: TargetConfig
) -> None:
    _tampered_bundle(tmp_path, target)
    env = _env(tmp_path)
    assert env.unsafe_target and env.pinned_manifest == tmp_path / "pinned-manifest.json"
    v = pf.preflight(env, engine=FakeEngine(platform_for(target.key)))
    assert v.warm
    assert v.notes[-1].startswith(
        f"UNSAFE: $KERNELBAKE_UNSAFE_TARGET moved target.json and the pinned manifest to {tmp_path}; "
    )
    assert f"WARNING: {v.notes[-1]}" in v.lines()


# -- a volume at /opt/kernelbake, or a file over the pinned manifest ---------------------------


@pytest.mark.parametrize(
    ("mounted", "covers"),
    [
        ("/opt/kernelbake", f"{TARGET_FILE} and {PINNED_MANIFEST} come"),
        ("/opt", f"{TARGET_FILE} and {PINNED_MANIFEST} come"),
        (PINNED_MANIFEST, f"{PINNED_MANIFEST} comes"),
        (TARGET_FILE, f"{TARGET_FILE} comes"),
    ],
)
def test_a_mount_at_or_above_a_trusted_file_is_named(
    monkeypatch: pytest.MonkeyPatch, mounted: str, covers: str
) -> None:
    files = _Files(monkeypatch)
    assert trusted.untrusted() == []
    files.mount(mounted)
    assert trusted.untrusted() == [
        f"{mounted} is a mount point (/proc/self/mountinfo), so {covers} from what the pod mounted there, "
        "not from the image; mount nothing at or above them (the caches' volume belongs at the cache root)"
    ]


def test_the_cache_roots_own_volume_and_the_containers_root_move_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    files = _Files(monkeypatch)
    # The documented recipes mount at the cache root, beside the trusted files, not above them.
    files.mount("/opt/kernelbake/cache")
    files.mount("/opt/kernelbake/cache/inductor")
    files.mount("/opt/kernelbake-other")
    assert trusted.untrusted() == []


def test_mount_points_are_read_with_their_escapes() -> None:
    text = (
        "70 27 0:5 / /opt/kernel\\040bake rw - tmpfs t rw\n71 27 0:5 / /a\\134b rw - tmpfs t rw\nshort line\n"
    )
    assert trusted.mount_points(text) == {"/opt/kernel bake", "/a\\b"}


def test_a_volume_over_the_trusted_directory_starts_cold_on_a_bundle_that_matches_its_own_pin(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: a volume holding target.json, a pinned manifest and a tampered cache that all
    agree, mounted where the image keeps them. Cold, naming the mount, and nothing started early."""
    _tampered_bundle(tmp_path, target)
    files = _Files(monkeypatch)
    engine = FakeEngine(platform_for(target.key))
    assert pf.preflight(_as_image(tmp_path), engine=engine).warm  # the same files, unmounted
    files.mount(tmp_path)
    v = pf.preflight(_as_image(tmp_path), engine=engine)
    assert not v.warm and v.cache_root != Path(target.cache_root)
    (problem,) = v.problems
    assert problem.startswith(
        f"{tmp_path} is a mount point (/proc/self/mountinfo), so {tmp_path}/target.json and "
        f"{tmp_path}/pinned-manifest.json come from what the pod mounted there"
    )
    assert pf.speculate(_as_image(tmp_path), engine) is None


def test_a_file_mounted_over_the_pinned_manifest_starts_cold_and_seed_cache_refuses(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tampered_bundle(tmp_path, target)
    _Files(monkeypatch).mount(tmp_path / "pinned-manifest.json")
    v = pf.preflight(_as_image(tmp_path), engine=FakeEngine(platform_for(target.key)))
    assert not v.warm
    assert v.problems[0].startswith(f"{tmp_path}/pinned-manifest.json is a mount point")
    with pytest.raises(BadInput, match=r"^seed-cache: .*/pinned-manifest.json is a mount point"):
        pf.seed(_as_image(tmp_path), tmp_path / "seed")


def test_unreadable_mountinfo_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    _Files(monkeypatch)

    def gone() -> str:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(trusted, "_mountinfo", gone)
    assert trusted.untrusted() == [
        f"/proc/self/mountinfo cannot be read (No such file or directory), so whether a mount of the pod "
        f"replaced {TARGET_FILE} and {PINNED_MANIFEST} is unknown"
    ]


# -- owned as the image's files are --------------------------------------------------------------


def test_files_not_owned_as_the_images_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    files = _Files(monkeypatch, euid=1000)
    files.owners[PINNED_MANIFEST] = 1000
    files.modes["/opt/kernelbake"] = stat.S_IFDIR | 0o777
    files.modes[TARGET_FILE] = stat.S_IFLNK | 0o777
    files.writable.add("/opt")
    assert trusted.untrusted() == [
        f"{TARGET_FILE} is a symlink, which the image's own files are not",
        "/opt/kernelbake is writable by group or others (mode 777)",
        "/opt is writable by uid 1000, which serves",
        f"{PINNED_MANIFEST} is owned by uid 1000, not by root as the image's files are",
    ]
    # Root may write what it owns (an image's files are root's): only other uids are judged so.
    files.euid = 0
    assert "/opt is writable by uid 1000, which serves" not in trusted.untrusted()


def test_a_pinned_manifest_owned_by_another_uid_starts_cold(
    tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tampered_bundle(tmp_path, target)
    _Files(monkeypatch).owners[str(tmp_path / "pinned-manifest.json")] = 1000
    v = pf.preflight(_as_image(tmp_path), engine=FakeEngine(platform_for(target.key)))
    assert not v.warm and v.problems == (
        f"{tmp_path}/pinned-manifest.json is owned by uid 1000, not by root as the image's files are",
    )


# -- a real mount ------------------------------------------------------------------------------------


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a bind mount in a private mount namespace needs root and unshare (CI runs as root)",
)
def test_a_real_bind_mount_from_the_same_filesystem_is_seen(tmp_path: Path) -> None:
    """st_dev would not tell: the mounted directory is on the same filesystem. In a mount
    namespace of its own, so nothing outside the test sees the mount."""
    (tmp_path / "trust").mkdir()
    (tmp_path / "evil").mkdir()
    files = [str(tmp_path / "trust" / "target.json"), str(tmp_path / "trust" / "pinned-manifest.json")]
    probe = f"from kernelbake.runtime import trusted; print('\\n'.join(trusted.untrusted({files!r})))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert "is a mount point" not in plain.stdout
    mounted = subprocess.run(
        [
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount --bind "{tmp_path}/evil" "{tmp_path}/trust" && exec "$0" -c "$1"', sys.executable, probe,
        ],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    assert f"{tmp_path}/trust is a mount point (/proc/self/mountinfo), so {' and '.join(files)} come" in (
        mounted.stdout
    )
