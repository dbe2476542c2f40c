"""Opening a source file for lint: a folder may hold anything under a *.py name (a FIFO, a
link to /dev/zero, a huge generated file), and reading one must never hang, follow a link out
of the tree or exhaust memory. The file is opened non-blocking without following a link, must be
a regular file, and is read up to MAX_SOURCE_BYTES; anything else is an OSError whose message
says why (lint reports it as one `Error:` line and exits 2)."""

from __future__ import annotations

import errno
import os
import stat

MAX_SOURCE_BYTES = 16 << 20  # far beyond a hand-written module; generated tables above it are not lint's


def read_source(path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link (not followed; name its target)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or socket)")
        if st.st_size > MAX_SOURCE_BYTES:
            raise OSError(errno.EFBIG, f"larger than {MAX_SOURCE_BYTES >> 20} MiB")
        data = os.read(fd, MAX_SOURCE_BYTES + 1)
        while len(data) <= MAX_SOURCE_BYTES and (chunk := os.read(fd, MAX_SOURCE_BYTES + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > MAX_SOURCE_BYTES:
        raise OSError(errno.EFBIG, f"larger than {MAX_SOURCE_BYTES >> 20} MiB")
    return data
