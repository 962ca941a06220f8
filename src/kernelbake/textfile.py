"""Reading a text file the user named (spec, policy, request, token), or one line saying why not."""

from __future__ import annotations

from pathlib import Path

from kernelbake.errors import BadInput


def read_text(path: str | Path, what: str, *, error: type[BadInput] = BadInput) -> str:
    """The file's text, decoded as UTF-8 (YAML and JSON are UTF-8 here).

    Raises ``error`` naming the file: what the OS said (a directory, a missing file, no
    permission), or where the first byte that is not UTF-8 is (a Latin-1 file, an image).
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise error(f"{p}: cannot read {what}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{p}: {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            hint="save it as UTF-8",
        ) from None
