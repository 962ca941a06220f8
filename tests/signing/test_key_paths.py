"""A key path that is not a readable key file (a symlink loop, a dangling symlink, a directory,
an unreadable file) is named with what is wrong with it, by every reader of a key path (sign
--key, verify --key, a policy's keys:, admission serve --tls-key): one line, exit code 2, and
what to do. Before, `sign --key LOOP` said "no signing key" for a loop or a dangling link."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kernelbake import textfile
from kernelbake.cli import main
from kernelbake.signing.keys import PUBLIC_KEY_HINT, SIGNING_KEY_HINT, generate_key_pair

IMAGE = "registry.example.com/kb/model@sha256:" + "a" * 64


def _loop(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    (tmp / "loop").symlink_to("loop")
    return tmp / "loop", "symlink loop"


def _dangling(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    (tmp / "dangling").symlink_to(tmp / "gone.key")
    return tmp / "dangling", f"dangling symlink to {tmp / 'gone.key'}, which does not exist"


def _chain(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    (tmp / "last").symlink_to("gone.key")
    (tmp / "first").symlink_to("last")
    return tmp / "first", f"dangling symlink to last (and on to {tmp / 'gone.key'}), which does not exist"


def _directory(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    (tmp / "keys").mkdir()
    return tmp / "keys", "a directory, not a regular file"


def _unreadable(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    path = tmp / "secret.key"
    path.write_text("-----BEGIN PRIVATE KEY-----\n")
    path.chmod(0)
    if os.geteuid() == 0:
        # root reads a mode-0 file: the OS's refusal a user gets is injected for this path.
        real = os.open

        def refusing(p: os.PathLike[str] | str, *args: int) -> int:
            if Path(p) == path:
                raise PermissionError(errno.EACCES, "Permission denied", str(p))
            return real(p, *args)

        monkeypatch.setattr(textfile.os, "open", refusing)
    return path, f"permission denied (kernelbake runs as uid {os.geteuid()})"


BAD_PATHS = {"loop": _loop, "dangling": _dangling, "chain": _chain, "dir": _directory, "mode0": _unreadable}
Maker = Callable[[Path, pytest.MonkeyPatch], tuple[Path, str]]


def _readers(tmp: Path, bad: Path) -> dict[str, tuple[list[str], str, str]]:
    """argv, what the message calls the file, the hint: for each reader of a key path."""
    _, pub = generate_key_pair(tmp / "good")
    policy = tmp / "policy.yaml"
    policy.write_text(f"keys: [{bad}]\n")
    admission = tmp / "admission.yaml"
    admission.write_text(f"images: [registry.example.com/kb/**]\nverify: {{keys: [{pub}]}}\n")
    serve = ["admission", "--policy", str(admission), "--tls-cert", str(pub), "--tls-key", str(bad)]
    return {
        "sign --key": (["sign", "--key", str(bad), IMAGE], "signing key", SIGNING_KEY_HINT),
        "verify --key": (["verify", "--key", str(bad), IMAGE], "public key", PUBLIC_KEY_HINT),
        "policy keys:": (["verify", "--policy", str(policy), IMAGE], "public key", PUBLIC_KEY_HINT),
        "admission --tls-key": (serve, "the key", "deploy/make-cert.sh makes one"),
    }


@pytest.mark.parametrize("reader", ["sign --key", "verify --key", "policy keys:", "admission --tls-key"])
@pytest.mark.parametrize("case", sorted(BAD_PATHS))
def test_every_key_reader_says_what_is_wrong_with_the_path(
    case: str,
    reader: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("KERNELBAKE_SIGNING_KEY", raising=False)
    bad, wrong = BAD_PATHS[case](tmp_path, monkeypatch)
    argv, what, hint = _readers(tmp_path, bad)[reader]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert err.count("\n") == 1 and "Traceback" not in out + err, err
    assert f"{bad}: cannot read {what}: {wrong}" in err, err
    assert f"({hint})" in err, err
    assert "no signing key" not in err


def test_a_missing_default_key_says_how_to_make_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KERNELBAKE_SIGNING_KEY", raising=False)
    monkeypatch.setenv("KERNELBAKE_BUILD_DIR", str(tmp_path / "build"))
    assert main(["sign", IMAGE]) == 2
    err = capsys.readouterr().err
    key = tmp_path / "build/signing/kernelbake.key"
    assert f"{key}: cannot read signing key: No such file or directory ({SIGNING_KEY_HINT})" in err, err
