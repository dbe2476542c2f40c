"""Parent-death watch: a process hctool starts exits when that hctool process dies.

hctool puts its own pid in HCTOOL_SUPERVISOR_PID (hctool.supervise.procs.inject_env) and the
injected sitecustomize calls `install_from_env()` in every Python process of the
job, so the watch covers the children hctool starts and their Python descendants
(torchrun's agent and workers, a launcher script's ranks) without any cooperation
from them. It works when hctool is SIGKILLed, where no teardown code can run.

Why a pidfd and not PR_SET_PDEATHSIG: PDEATHSIG fires when the parent *thread*
exits and only covers direct children; a pidfd names one process (no pid reuse)
and poll() on it wakes exactly when that process exits, costing nothing meanwhile.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time

from hctool.agent.clock import REAL
from hctool.protocol import env as protocol_env

ENV = protocol_env.SUPERVISOR_PID
GRACE_S = 3.0  # SIGTERM first (lets torchrun's agent stop its workers), then SIGKILL
FALLBACK_POLL_S = 0.5

_fork_hook_registered = False


def install_from_env(environ=os.environ) -> int | None:
    """Start the watch if HCTOOL_SUPERVISOR_PID names a pid; return that pid."""
    value = environ.get(ENV, "").strip()
    if not value:
        return None
    pid = int(value)
    if pid == os.getpid():
        return None  # the supervisor itself (it ran with its own variable set)
    watch(pid)
    return pid


def watch(pid: int) -> None:
    """Exit this process when process `pid` exits (already gone: exit now)."""
    global _fork_hook_registered
    fd = _pidfd(pid)
    if not _started_before_me(pid):  # gone, or the pid now names a younger process
        if fd is not None:
            os.close(fd)
        _exit_for(pid)
        return
    threading.Thread(target=_wait_then_exit, args=(pid, fd), name="hctool-lifeline", daemon=True).start()
    if not _fork_hook_registered:
        # Threads do not survive fork(): a forked child (multiprocessing, DataLoader
        # workers) starts its own watch on the same supervisor.
        os.register_at_fork(after_in_child=lambda: watch(pid))
        _fork_hook_registered = True


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None  # no pidfd (old kernel or Python), or the process is gone


def _start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        with REAL.open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[19])  # fields after "(comm)" start at field 3


def _started_before_me(pid: int) -> bool:
    theirs, mine = _start_ticks(pid), _start_ticks(os.getpid())
    if theirs is None:
        return False if os.path.isdir("/proc/self") else _alive(pid)
    return mine is None or theirs <= mine


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_then_exit(pid: int, fd: int | None) -> None:
    if fd is not None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():  # blocks without a timeout: woken when the process exits
            pass
        os.close(fd)
    else:
        while _alive(pid) and _started_before_me(pid):
            time.sleep(FALLBACK_POLL_S)
    _exit_for(pid)


def _exit_for(pid: int) -> None:
    try:
        sys.stderr.write(f"hctool: supervisor (pid {pid}) is gone; process {os.getpid()} exits\n")
        sys.stderr.flush()
    except Exception:
        pass
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACE_S)  # only reached when SIGTERM is handled without exiting
    finally:
        os.kill(os.getpid(), signal.SIGKILL)
