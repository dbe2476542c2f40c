"""One run per folder: `check-consensus run` claims its --trace-dir, `repro` and `chaos` their
--artifacts, so two jobs pointed at one folder (parallel CI jobs with a fixed path, `make -j`)
never mix their files.

The claim is an exclusive flock on FOLDER/hctool.lock, held until the process ends; the file
names the holder (pid, host, command, start, run id). A second run on the folder is refused with
one Error line naming the holder. A lock whose holder died is free by itself (the kernel drops
a dead process's flock; NFS clients do too), so a stale lock is taken over, and said so.

The run id also goes to the ranks (HCTOOL_RUN_ID, in every trace header), and the trace reader
keeps only files whose header names the run the lock names (consensus/trace.py): a file left by
anything else in the folder is ignored, with a line saying so.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from hctool.console import log
from hctool.console.errors import UsageError
from hctool.console.runs import MARKER
from hctool.protocol import env as protocol_env
from hctool.protocol.runrecord import LOCK_NAME
from hctool.protocol.runrecord import MAX_LOCK_BYTES as MAX_BYTES
from hctool.protocol.runrecord import claimed_run as claimed_run
from hctool.protocol.safefile import read_regular

_held: list[Claim] = []  # claims live as long as the process


@dataclass
class Claim:
    folder: Path
    fd: int
    run_id: str


def claim(folder: Path, what: str, refuse_glob: str | None = None) -> Claim:
    """Claim `folder` for this process (created if missing) or raise UsageError naming the holder.
    refuse_glob: files matching it mean the folder holds another run's results: refused too."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror})"
        raise UsageError(f"{path} {why}", "someone else can write into that folder: use one of your own") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(
            f"{path} is not a regular file", "someone else can write into that folder: use one of your own"
        )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _holder(path)
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise UsageError(f"cannot lock {path}: {exc.strerror}", "use a folder on a local disk") from None
        raise UsageError(
            f"{folder} is in use by another run: {describe(holder)}",
            "wait for it to end, or give this run a folder of its own",
        ) from None
    if refuse_glob is not None and any(p.name not in (LOCK_NAME, MARKER) for p in folder.glob(refuse_glob)):
        os.close(fd)
        raise UsageError(f"{folder} already holds the files of another run", "pass a new folder or remove the old one")
    previous = _holder(path)
    if previous.get("pid"):
        log.info(f"hctool: taking over {path} from {describe(previous)}, which is no longer running")
    run_id = uuid.uuid4().hex[:16]
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": f"hctool {what}",
        "argv": " ".join(sys.argv)[:300],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run": run_id,
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    os.environ[protocol_env.RUN_ID] = run_id  # the ranks this process starts carry it in their headers
    held = Claim(folder, fd, run_id)
    if not _held:
        atexit.register(_release_all)
    _held.append(held)
    return held


def _release_all() -> None:
    # An orderly end keeps the run id (for a later `analyze`) but no holder: the next run takes the
    # folder silently. A killed holder leaves its pid, and the next run says it took over.
    for held in _held:
        try:
            os.ftruncate(held.fd, 0)
            os.pwrite(
                held.fd, json.dumps({"run": held.run_id, "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode(), 0
            )
        except OSError:
            pass


def describe(holder: dict) -> str:
    if not holder.get("pid"):
        return "a holder that did not say who it is"
    return (
        f"pid {holder['pid']} on {holder.get('host', '?')} ({holder.get('command', '?')}, "
        f"since {holder.get('started', '?')})"
    )


def _holder(path: Path) -> dict:
    try:
        data = json.loads(read_regular(path, MAX_BYTES) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
