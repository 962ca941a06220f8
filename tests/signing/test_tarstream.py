"""A snapshot's layer made as it is read: the bytes ``tarfile`` would write, its length known
before a byte is read, and a file that changed after it was recorded stops it."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from kernelbake.errors import BadInput
from kernelbake.oci import RegistryClient, parse_reference
from kernelbake.settings import Settings
from kernelbake.signing import referrer
from kernelbake.signing.tarstream import FileTar, Member, Reader


def _tree(root: Path, sizes: dict[str, int]) -> tuple[Member, ...]:
    out = []
    for rel, size in sizes.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        p.write_bytes(data)
        out.append(Member(path=rel, size=size, sha256=hashlib.sha256(data).hexdigest()))
    return tuple(out)


def _tarfile_bytes(root: Path, members: tuple[Member, ...]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        seen: set[str] = set()
        for m in members:
            with (root / m.path).open("rb") as fh:
                referrer.add_file(tar, m.path, m.size, 0o444, 0, fh, seen)
    return buf.getvalue()


SIZES = {
    "images/pages-1.img": 3 * 512 + 7,
    "images/core-1.img": 0,
    "images/weights/part-0000.bin": 10240 * 3,
    "images/weights/part-0001.bin": 1,
    # A name past ustar's 100 characters: a PAX header of its own.
    "images/" + "d" * 120 + "/x.img": 513,
    "engine.log": 9_000_001,
}


def test_the_stream_is_the_tar_tarfile_writes(tmp_path: Path) -> None:
    members = _tree(tmp_path, SIZES)
    want = _tarfile_bytes(tmp_path, members)
    tar = FileTar(tmp_path, members)
    assert tar.size() == len(want)
    assert b"".join(tar.chunks()) == want
    d = tar.descriptor()
    assert (d.digest, d.size) == ("sha256:" + hashlib.sha256(want).hexdigest(), len(want))
    # And it reads back as the files it holds.
    with tarfile.open(fileobj=io.BytesIO(want)) as back:
        assert (
            back.extractfile("images/weights/part-0001.bin").read()
            == (tmp_path / "images/weights/part-0001.bin").read_bytes()
        )  # type: ignore[union-attr]


@pytest.mark.parametrize("n", [1, 511, 8192, 1 << 20, -1])
def test_the_reader_gives_every_byte_once_whatever_it_is_asked_for(tmp_path: Path, n: int) -> None:
    members = _tree(tmp_path, SIZES)
    tar = FileTar(tmp_path, members)
    reader = tar.reader()
    assert len(reader) == tar.size()
    got = bytearray()
    while piece := reader.read(n):
        assert n < 0 or len(piece) <= n
        got += piece
    assert bytes(got) == _tarfile_bytes(tmp_path, members)
    assert reader.read(n) == b""


def test_a_reader_over_small_pieces_joins_them() -> None:
    reader = Reader(iter([b"ab", b"", b"cde", b"f"]), 6)
    assert [reader.read(4), reader.read(4), reader.read(4)] == [b"abcd", b"ef", b""]


@pytest.mark.parametrize("change", ["bytes", "grew", "shrank"])
def test_a_file_that_changed_after_it_was_recorded_stops_the_layer(tmp_path: Path, change: str) -> None:
    members = _tree(tmp_path, {"images/pages-1.img": 4096, "images/core.img": 100})
    p = tmp_path / "images/pages-1.img"
    data = p.read_bytes()
    p.write_bytes({"bytes": b"x" + data[1:], "grew": data + b"x", "shrank": data[:-1]}[change])
    with pytest.raises(
        BadInput, match=r"pages-1\.img: sha256 .* recorded [0-9a-f]{64} \(4096 B\); it changed after"
    ):
        FileTar(tmp_path, members).descriptor()


@pytest.mark.registry
def test_a_file_changed_during_the_upload_stops_it_and_the_registry_keeps_nothing(
    registry: str, tmp_path: Path
) -> None:
    """The digest was taken, then a file changed (same size): the upload stops on the file, says
    which, and no blob is committed under the digest."""
    members = _tree(tmp_path, {"images/pages-1.img": 3 << 20, "images/core.img": 100})
    tar = FileTar(tmp_path, members)
    d = tar.descriptor()
    p = tmp_path / "images/core.img"
    p.write_bytes(b"y" + p.read_bytes()[1:])
    client = RegistryClient(Settings(docker_config=tmp_path / "docker"), timeout=30)
    ref = parse_reference(f"{registry}/kb/tarstream:v1")
    with pytest.raises(BadInput, match=r"core\.img: sha256 .* it changed after it was recorded"):
        client.put_blob_stream(ref, d.digest, d.size, tar.reader)
    assert not client.has_blob(ref, d.digest)
    # Recorded afresh and left alone, the layer goes up whole under its digest.
    members = _tree(tmp_path, {"images/pages-1.img": 3 << 20, "images/core.img": 100})
    tar = FileTar(tmp_path, members)
    d = tar.descriptor()
    assert client.put_blob_stream(ref, d.digest, d.size, tar.reader) == d.digest
    assert client.has_blob(ref, d.digest)
