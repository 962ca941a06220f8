"""Reading a file the user named (spec, policy, request, token, key), or one line saying why not.

Every input file goes through ``read_bytes``: a named path may be a FIFO (opening it would wait
for a writer forever), a character device (``/dev/zero`` never ends) or a file far larger than
any spec. So the file is opened without blocking, must be a regular file, and is read up to a
size limit; past it, reading stops and the file is refused, whatever its size. A path that
cannot be opened is named with what is wrong with it (``_unopenable``).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from kernelbake.errors import BadInput

# Specs, policies, tokens, keys and trust roots are under 10 KiB. Pure-Python YAML parses the
# worst 256 KiB (a list of 30,000 small items) in about 2 s on a loaded 2-core machine; a
# limit of 1 MiB took 9 s there.
MAX_INPUT_BYTES = 256 << 10


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _unopenable(p: Path, exc: OSError) -> str:
    """What is wrong with ``p``, which could not be opened. The OS's words name neither the
    link nor its target: a dangling symlink reads "No such file or directory" although the
    link is there, and a loop "Too many levels of symbolic links"."""
    if exc.errno == errno.ELOOP:
        return "symlink loop (or a chain of more than 40 links); point it at the file itself"
    if exc.errno == errno.ENOENT and p.is_symlink():
        try:
            link = p.readlink()
            # A chain of links: name where it ends too, the path that is missing.
            via = f" (and on to {p.resolve()})" if (p.parent / link).is_symlink() else ""
        except (OSError, RuntimeError):  # replaced since the open: say what the OS said
            return exc.strerror or str(exc)
        return f"dangling symlink to {link}{via}, which does not exist"
    if exc.errno == errno.EACCES:
        return f"permission denied (kernelbake runs as uid {os.geteuid()}); check the file's mode and owner"
    return exc.strerror or str(exc)


def read_bytes(
    path: str | Path,
    what: str,
    *,
    error: type[BadInput] = BadInput,
    limit: int = MAX_INPUT_BYTES,
    hint: str | None = None,
) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises ``error`` naming the file and what is wrong with it: missing, a dangling symlink (and
    its target), a symlink loop, no permission, no regular file (a FIFO, a device, a directory),
    or over ``limit`` bytes. ``hint`` says what to do instead (where to get such a file).
    """
    p = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"{p}: cannot read {what}: {_unopenable(p, exc)}", hint=hint) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{p}: cannot read {what}: {_kind(mode)}, not a regular file", hint=hint)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise error(f"{p}: cannot read {what}: {exc.strerror or exc}", hint=hint) from None
    finally:
        os.close(fd)
    if size > limit:
        raise error(f"{p}: {what} is over the {limit}-byte limit", hint="is this the right file?")
    return b"".join(chunks)


def read_text(
    path: str | Path, what: str, *, error: type[BadInput] = BadInput, limit: int = MAX_INPUT_BYTES
) -> str:
    """The file's text (``read_bytes``), decoded as UTF-8 (YAML and JSON are UTF-8 here).

    Also raises ``error`` naming the file and offset of the first byte that is not UTF-8 (a
    Latin-1 file, an image) or a NUL (no text format we read allows one).
    """
    p = Path(path)
    data = read_bytes(p, what, error=error, limit=limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{p}: {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            hint="save it as UTF-8",
        ) from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise error(f"{p}: {what} is not text (a NUL byte at offset {nul})")
    return text
