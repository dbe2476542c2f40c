"""How often each of this rank's faults fired, and whether a named target was found: written
beside the traces as faults-rank{R}-{pid}.json (atomically: at a fault's first firing, then at
most every 0.5 s while counts change, at exit and before os._exit), so a report can say "fired
12 times on rank 1" or "never fired". A rank killed in between loses at most 0.5 s of counts."""

from __future__ import annotations

import atexit
import json
import os
import tempfile
import threading

from hctool.agent import names
from hctool.agent.clock import REAL
from hctool.protocol import env as protocol_env
from hctool.protocol import faultcounts

FLUSH_S = 0.5
_lock = threading.RLock()
_in_flush = threading.local()  # this thread is flushing: its own write must not count or flush again
_counts: dict = {}  # Fault -> times fired
_targets: dict = {}  # Fault -> the function it acts on (by-name kinds)
_order: list = []
_rank: int | None = None
_dirty = False
_path: str | None = None
_pid: int | None = None  # the process the counts belong to: a fork's child writes none of them


def start(faults, rank: int) -> None:
    global _rank, _path, _pid
    _rank, _pid = rank, os.getpid()
    for f in faults:
        if f not in _counts:
            _counts[f] = 0
            _order.append(f)
    folder = os.environ.get(protocol_env.TRACE_DIR) or os.environ.get(protocol_env.RUN_DIR)
    if folder and _path is None:
        _path = os.path.join(folder, faultcounts.file_name(rank, os.getpid()))
        threading.Thread(target=_flusher, name="hctool-fault-counts", daemon=True).start()
        atexit.register(flush)
        real_exit = os._exit

        def exit_after_flush(code):  # programs that leave by os._exit skip atexit
            if os.getpid() == _pid:  # a forked worker (a DataLoader's) leaves at once: its
                flush()  # lock may be held by a thread that did not fork with it
            real_exit(code)

        os._exit = exit_after_flush


def fired(f) -> None:
    global _dirty
    if f in _counts and not getattr(_in_flush, "on", False):  # other threads' firings still count
        _counts[f] += 1  # a lost increment under a race costs one count, never a wrong answer
        _dirty = True
        if _counts[f] == 1:
            flush()  # "fired at all" survives whatever ends the rank next


def track_target(f, target: str) -> None:
    _targets[f] = target


def snapshot() -> list[dict]:
    out = []
    for f in _order:
        entry = {"spec": f.spec(), "fired": _counts[f]}
        if f in _targets:
            entry["target"] = _targets[f]
            entry["resolved"] = names.state_of(_targets[f])
        out.append(entry)
    return out


def flush() -> None:
    """Write the counts (os.write on a raw descriptor: open() may be faulted, io-delay)."""
    global _dirty
    if _path is None or getattr(_in_flush, "on", False) or os.getpid() != _pid:
        return
    with _lock:
        _in_flush.on, _dirty = True, False
        try:
            data = json.dumps({"rank": _rank, "pid": os.getpid(), "faults": snapshot()}).encode()
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(_path), prefix=".faults-", suffix=".tmp")
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, _path)
        except OSError:
            pass  # a full or vanished folder: the run goes on without the counts
        finally:
            _in_flush.on = False


def _flusher() -> None:
    while True:
        REAL.sleep(FLUSH_S)
        if _dirty:
            flush()
