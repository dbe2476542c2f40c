"""The recorder's per-process state: one module, read by every capture route.

`S` is the one `_State` of this process; `inside` holds the threads that are inside a
recorded call (a collective torch issues from inside one is not recorded twice).
_fastpath.c and _c10d_kernel.cpp read some fields by name (`READ_BY_C`): rename one and
tests/consensus/test_fastpath.py fails, rather than the C path reading nothing.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
import weakref
from pathlib import Path

# Frames in this folder are hctool's own: a call site is the first frame outside torch and it.
HCTOOL_DIR = str(Path(__file__).resolve().parents[2]) + os.sep
# Sequence numbers and ring slots. The C++ capture kernel, when loaded, swaps in its Counter,
# which it takes from without the GIL (c10d.load_kernel).
new_counter = itertools.count
on_reset: list = []  # called when _State.reset() renews the tables (the C++ kernel forgets its copies)


class _Group:
    __slots__ = ("id", "key", "ranks", "member", "seq", "pg")

    def __init__(self, gid: int, key: str, ranks: list[int], member: bool, pg) -> None:
        self.id, self.key, self.ranks, self.member = gid, key, ranks, member
        self.seq = new_counter()  # next() is atomic (itertools.count: under the GIL)
        # A weak reference: keeping a destroyed group alive until interpreter exit
        # makes gloo's threads die in the wrong order (std::terminate). When it
        # goes, its id may be reused: forget the mapping.
        self.pg = None if pg is None else weakref.ref(pg, lambda _, k=id(pg): _S.groups.pop(k, None))


class _State:
    def __init__(self) -> None:
        self.trace_dir: str | None = None
        self.run_id: str | None = None  # the run that claimed the trace folder (read at install)
        self.internal: tuple[str, ...] = (HCTOOL_DIR, "<frozen")  # torch's folder is added when it is patched
        self.lock = threading.RLock()
        # How wrapped calls are recorded: False (Python), "c" (the C hot path), "c+tls" (and it
        # goes below autograd through c10's dispatch TLS, not the pybind guard); wrappers.py
        self.fastpath: str | bool = False
        self.c10d_kernel = "python"  # what sees C++-issued calls: "python" or "c++" (c10d.py)
        self.before_call = None  # fn(op, group index) before each recorded call (agent/faults/collectives.py)
        self.reset()

    def reset(self) -> None:
        self.fd: int | None = None  # side table
        self.ring_fd: int | None = None
        self.stopped = False  # the trace folder was full: nothing more is recorded (tracefile.py)
        self.reserve: str | None = None  # the file freed at that stop, for the mark and the end record
        self.segs: list[mmap.mmap] = []
        self.slots = new_counter()
        self.backward_site = 0  # site id of the main thread's backward call in progress (wrappers.py)
        self.label_ids = itertools.count(1)
        self.label_seq = itertools.count()
        self.group_seq = itertools.count()  # position in the "groups" sequence (new_group calls)
        self.rank: int | None = None
        self.world: _Group | None = None  # the default group
        self.groups: dict[int, _Group] = {}  # id(pg) -> group
        self.group_ids = itertools.count(1)  # creation index of new_group (0: the default group)
        self.group_uids = itertools.count(1)  # the id ring records carry
        self.interned: dict[str, dict] = {k: {} for k in ("op", "site", "desc", "th", "ro")}
        self.code_internal: dict = {}
        self.ro_by_id: dict[int, int] = {}
        self.keep: list = []  # objects whose id() is part of a key
        self.error: str | None = None
        self.dist = None  # torch.distributed, once imported
        for forget in on_reset:
            forget()


S = _State()
_S = S  # the short name the hot paths use


def enabled() -> bool:
    return _S.trace_dir is not None


inside: set[int] = set()  # threads inside a recorded call (cheaper than a threading.local)


def nested() -> bool:
    """Whether this thread is already inside a recorded call."""
    return threading.get_ident() in inside


# What the C modules read by name (bind() hands them S and the group objects).
READ_BY_C = {
    "_State": ("trace_dir", "segs", "slots", "groups", "world", "interned", "code_internal", "ro_by_id"),
    "_Group": ("id", "member", "seq"),
}


def group_index(group) -> str:
    """The creation index of a group as the trace keys it ("0": the default group)."""
    if group is None:
        return "0"
    g = S.groups.get(id(group))
    return g.key.split(":", 1)[0] if g is not None else "?"
