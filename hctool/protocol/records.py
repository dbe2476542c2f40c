"""The trace format shared by the recorder (writer) and trace.py (reader), and
the typed records both sides speak. docs/consensus.md "Trace format" is the
prose version of this file.

Per rank process, two files in the trace folder:
  rank{R}-{pid}.jsonl  the side table: one JSON object per line, appended with
                       os.write (header, groups, interned names, labelled
                       events, errors, end). Written rarely: once per new call
                       site, shape, group or thread, not per collective.
  rank{R}-{pid}.ring   fixed-size binary records (CALL below), one per
                       collective, written through a MAP_SHARED mmap of the
                       file (grown SEGMENT bytes at a time). The kernel keeps
                       the pages after SIGKILL or abort, and writing costs no
                       system call.
A CALL record's ids refer to side-table lines written before it, so a reader
that reads the ring first and the side table second can resolve every record.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TypedDict

FORMAT_VERSION = 2
# kind, state, flags, op, group, site, desc, thread, reduce op, root/peer, seq, t entered, t done, pad
CALL = struct.Struct("<BBHIIIIIIiqdd8x")
RECORD_SIZE = CALL.size  # 64 bytes
T_DONE_OFFSET = 48  # where "t done" sits inside a record
DONE = struct.Struct("<d")
SEGMENT = 1 << 20  # the ring file grows by this much (16384 records)
PER_SEGMENT = SEGMENT // RECORD_SIZE

KIND_EMPTY, KIND_CALL, KIND_VOID = 0, 1, 2  # byte 0, written last: a record is whole once it is non-zero
STATE_ENTERED, STATE_COMPLETED, STATE_FAILED = 1, 2, 3  # byte 1, rewritten in place on completion
FLAG_ASYNC = 1
NO_ROOT = -1

# A label (assert_same, rank_consensus) is stored whole up to MAX_LABEL characters; a longer one
# as its head, its length and a digest of the whole, so ranks with different labels still differ
# and a 1.2 MB label no longer makes a side-table line the reader refuses ("line too long").
MAX_LABEL = 256


def bounded_label(label: str) -> str:
    if len(label) <= MAX_LABEL:
        return label
    import hashlib

    digest = hashlib.blake2b(label.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"{label[: MAX_LABEL - 48]}... ({len(label)} chars, blake2b {digest})"


# Side-table interned kinds ({"i": kind, "id": n, "v": value}); id 0 means "none".
INTERNED = ("op", "site", "desc", "th", "ro")


@dataclass(frozen=True)
class CallRecord:
    """One decoded ring record (ids still to be resolved through the side table)."""

    slot: int
    state: int
    flags: int
    op: int
    group: int
    site: int
    desc: int
    thread: int
    reduce_op: int
    root: int
    seq: int
    t: float
    t_done: float

    @classmethod
    def unpack(cls, slot: int, raw: tuple) -> CallRecord:
        return cls(slot, *raw[1:])


@dataclass(frozen=True)
class Site:
    site: str | None  # "file.py:LINE" of the first frame outside torch and hctool
    fn: str | None
    stack: tuple[str, ...]  # "path:LINE function", innermost first


# What the aligner compares: one collective call (or labelled value, or one peer
# operation of a batch_isend_irecv) of one rank. Functional form: "async" is a keyword.
Event = TypedDict(
    "Event",
    {
        "rank": int,
        "g": str,  # group key "<creation index>:[ranks]", or "labels"
        "op": str,
        "sh": list,  # shapes of what this rank contributes
        "dt": list,  # dtypes
        "ro": "str | None",  # reduce op
        "root": "int | None",
        "dir": str,  # p2p only: "send" | "recv"
        "peer": "int | None",  # p2p only
        "label": "str | None",
        "digest": "str | None",
        "value": "str | None",
        "site": "str | None",  # "file.py:LINE"
        "fn": "str | None",
        "stack": list,  # "path:LINE function", innermost first
        "th": "str | None",
        "t": float,  # monotonic clock, entered
        "w": float,  # wall clock, entered
        "t_done": "float | None",
        "state": str,  # "blocked" | "completed" | "failed"
        "err": str,
        "async": bool,
    },
    total=False,
)
