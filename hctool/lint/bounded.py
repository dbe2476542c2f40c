"""Analyzing one large file within a memory budget.

Python's parser builds the whole tree before lint sees it, at about 400 bytes per source byte of
dense code (measured: 2.1 MB of calls or of a literal list, 0.7 to 0.8 GB): a 13.5 MB generated
module, under read_source's 16 MiB cap, took 6.2 GB, once in each worker that met such a file.
A file above BOUNDED_FROM_BYTES is therefore analyzed in a child process forked for it, whose
address space is limited to what it had at the fork plus the budget; a file that needs more is
refused, with that reason, as an unparsable file is (exit 2, the other files' findings kept).
Smaller files cannot reach the budget (400 x 1 MiB) and skip the fork.

The whole run's peak is then bounded: the main process (the project's summaries) plus, in each of
the --jobs workers, what its largest file below the threshold took or the budget.
"""

from __future__ import annotations

import errno
import os
import pickle
import resource

BOUNDED_FROM_BYTES = 1 << 20
DEFAULT_BUDGET_MIB = 2048
BUDGET_LIMITS_MIB = (64, 1 << 20)  # [tool.hctool.lint] memory-per-file: from 64 MiB to 1 TiB
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _address_space() -> int:
    with open("/proc/self/statm", "rb") as fh:
        return int(fh.read().split()[0]) * _PAGE


def needs_bound(size: int) -> bool:
    return size > BOUNDED_FROM_BYTES and hasattr(os, "fork") and os.path.exists("/proc/self/statm")


def call(fn, args: tuple, budget_mib: int):
    """fn(*args) in a forked child limited to BUDGET_MIB more address space than it starts with.
    Its result comes back pickled; MemoryError in the child (or its death) is an OSError here,
    whose message is the reason the file is not analyzed."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        status = 0
        try:
            os.close(r)
            _, hard = resource.getrlimit(resource.RLIMIT_AS)
            limit = _address_space() + (budget_mib << 20)
            if hard != resource.RLIM_INFINITY:
                limit = min(limit, hard)
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
            try:
                out = ("ok", fn(*args))
            except MemoryError:
                out = ("memory", None)
            data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
            view = memoryview(data)
            while view:
                view = view[os.write(w, view) :]
        except BaseException:  # noqa: BLE001 - whatever happened, the parent reads "no answer"
            status = 1
        finally:
            os._exit(status)
    os.close(w)
    chunks = []
    try:
        while chunk := os.read(r, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    try:
        kind, value = pickle.loads(b"".join(chunks)) if chunks else ("memory", None)
    except Exception:  # a child that died mid-write (killed for memory): its answer is cut short
        kind, value = "memory", None
    if kind != "ok":
        raise OSError(
            errno.ENOMEM,
            f"needs more than {budget_mib} MiB of memory to parse (lint's budget per "
            "file, [tool.hctool.lint] memory-per-file)",
        )
    return value


def peak_mib() -> tuple[float, float]:
    """(this process's peak RSS, the largest peak of a finished child, workers included), MiB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, child
