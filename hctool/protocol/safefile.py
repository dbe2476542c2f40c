"""Files in folders that someone else may write into (a shared --trace-dir, a run folder, a
cache): never written through a link planted there, never blocked on a FIFO, never read past a
size cap. Both sides of the process boundary use it (standard library only).

- A file we make is made under a name nobody can predict (mkstemp: O_CREAT|O_EXCL, a random
  suffix) and renamed into place, or created with O_EXCL|O_NOFOLLOW under its own name, so a
  planted link is replaced or refused, never followed.
- A file we append to (a rank's log) is opened O_NOFOLLOW|O_NONBLOCK and must be a regular file
  with one link (a hard link to another file is refused too).
- A file we read is opened O_NOFOLLOW|O_NONBLOCK and must be a regular file within a size; a
  file the user named (read_named) may be a link to one.
Each refusal is an UnsafeFile (an OSError) whose message says what was found.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafeFile(OSError):
    """A path that is a link, a FIFO, a device, a directory, a hard link or too large."""


def _check_regular(fd: int, path, limit: int | None = None, one_link: bool = False) -> os.stat_result:
    st = os.fstat(fd)
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = "not a regular file"
    elif one_link and st.st_nlink > 1:
        why = f"a regular file with {st.st_nlink} hard links"
    elif limit is not None and st.st_size > limit:
        why = f"larger than {limit} bytes"
    if why is not None:
        os.close(fd)
        raise UnsafeFile(errno.EPERM, f"{path} is {why}; refusing to use it")
    return st


def _no_link(exc: OSError, path) -> OSError:
    # O_NOFOLLOW on a symlink fails with ELOOP: say what it is.
    if exc.errno == errno.ELOOP:
        return UnsafeFile(errno.ELOOP, f"{path} is a symbolic link; refusing to follow it")
    return exc


def write_atomic(path, data: bytes, mode: int = 0o644) -> None:
    """`path` holds `data` whole or not at all; a link planted at `path` is replaced, not followed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def create_exclusive(path, flags: int = os.O_WRONLY, mode: int = 0o644) -> int:
    """A new file at `path` (O_CREAT|O_EXCL|O_NOFOLLOW): anything already there, a link
    included, is refused with FileExistsError."""
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, mode)


def open_append(path, mode: int = 0o644) -> int:
    """An fd appending to the regular file `path` (created if missing)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise UnsafeFile(errno.ENXIO, f"{path} is not a regular file; refusing to use it") from None
        raise _no_link(exc, path) from None
    _check_regular(fd, path, one_link=True)
    os.set_blocking(fd, True)
    return fd


def read_regular(path, limit: int, follow: bool = False) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them (else UnsafeFile).
    follow: a link at `path` is followed (a file the user named; what it points at must still be
    a regular file within the limit), else refused."""
    try:
        fd = os.open(path, os.O_RDONLY | (0 if follow else os.O_NOFOLLOW) | os.O_NONBLOCK | _CLOEXEC)
    except OSError as exc:
        raise _no_link(exc, path) from None
    _check_regular(fd, path, limit)
    chunks, size = [], 0
    try:  # os.read, not open(): a fault may have patched open() (agent/faults/files.py, io-delay)
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:  # grew since fstat
        raise UnsafeFile(errno.EFBIG, f"{path} is larger than {limit} bytes; refusing to use it")
    return data


def read_named(path, limit: int) -> bytes:
    """A file the user named (a chaos schedule or report, a gate's pyproject.toml, a run's
    report.json): the one safe reader, as lint reads sources (hctool/lint/source.py): opened
    non-blocking (a FIFO is refused at once, not waited on), a regular file (a link to /dev/zero
    is a device: refused), at most `limit` bytes. A link the user made to a real file is
    followed: the user chose it."""
    return read_regular(path, limit, follow=True)


def why(exc: OSError, path) -> str:
    """One line for a read that failed: an UnsafeFile already names the path."""
    if isinstance(exc, UnsafeFile):
        return str(exc.strerror)
    return f"{path}: {exc.strerror or exc}"
