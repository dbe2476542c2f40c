"""The analyzer's fast path: calls read as columns (numpy), and the prefix every rank agrees
on folded away in bulk, without making a Python object per call.

Most of a long run is calls every rank made alike. The reader (trace.py) hands completed,
non-p2p calls of the ring files as numpy rows instead of event dicts; `Interner` maps each
file's local ids (op, call site, shapes, reduce op) to ids shared by every file, and to the
same hard signature and call-site key the dict path computes (pattern.py), so the two paths
agree by construction. `fold` then, per channel, compares the members' rows position by
position as arrays: the longest prefix where every member made the same call from the same
place goes into the channel's history (blame.History.learn_block: counts, transitions, run
lengths, shapes per place) and is dropped; from the first position where they differ (a
mismatch, a cross-site pairing, a rank that has no row yet) the rows become event dicts and
the ordinary path takes over. The result is the same analysis at a few hundred nanoseconds a
call (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hctool.consensus.pattern import hard_signature, pattern_key, site_key
from hctool.protocol.records import KIND_CALL, STATE_COMPLETED

RECORD_DTYPE = np.dtype(
    [
        ("kind", "u1"),
        ("state", "u1"),
        ("flags", "<u2"),
        ("op", "<u4"),
        ("group", "<u4"),
        ("site", "<u4"),
        ("desc", "<u4"),
        ("th", "<u4"),
        ("ro", "<u4"),
        ("root", "<i4"),
        ("seq", "<i8"),
        ("t", "<f8"),
        ("t_done", "<f8"),
        ("pad", "V8"),
    ]
)
P2P_OPS = {"send", "isend", "send_object_list", "recv", "irecv", "recv_object_list", "batch_isend_irecv"}


@dataclass
class Block:
    """One rank's calls in one channel, in order, as columns (global ids)."""

    rank: int
    hard: np.ndarray  # hard signature id per call
    key: np.ndarray  # call-site key id per call
    op: np.ndarray  # op id per call (for the counts)
    make: Callable[[int], dict]  # row i as the event dict the ordinary path uses
    t: np.ndarray  # entry time per call
    th: np.ndarray  # the file's thread id per call

    def __len__(self) -> int:
        return len(self.hard)

    def tail(self, start: int) -> Block:
        return Block(
            self.rank,
            self.hard[start:],
            self.key[start:],
            self.op[start:],
            lambda i, m=self.make, s=start: m(i + s),
            self.t[start:],
            self.th[start:],
        )


def concat(blocks: list[Block]) -> Block:
    """One rank's blocks of one channel (several files: a restarted process), in order."""
    if len(blocks) == 1:
        return blocks[0]
    offsets = np.cumsum([0] + [len(b) for b in blocks])

    def make(i: int) -> dict:
        k = int(np.searchsorted(offsets, i, side="right")) - 1
        return blocks[k].make(i - int(offsets[k]))

    return Block(
        blocks[0].rank,
        np.concatenate([b.hard for b in blocks]),
        np.concatenate([b.key for b in blocks]),
        np.concatenate([b.op for b in blocks]),
        make,
        np.concatenate([b.t for b in blocks]),
        np.concatenate([b.th for b in blocks]),
    )


class Interner:
    """Ids shared by every trace file of an analysis, and the objects behind them."""

    def __init__(self) -> None:
        self.ops: dict[str, int] = {}
        self.op_names: list[str] = []
        self._values: dict[str, dict] = {"site": {}, "desc": {}, "ro": {}}
        self._hard: dict = {}
        self.hard_obj: list[tuple] = []
        self._key: dict = {}
        self.key_obj: list = []
        self.site_obj: list = []
        self.p2p_ops: set[int] = set()

    def op_id(self, name: str) -> int:
        ident = self.ops.get(name)
        if ident is None:
            ident = self.ops[name] = len(self.op_names)
            self.op_names.append(name)
            if name in P2P_OPS:
                self.p2p_ops.add(ident)
        return ident

    def value_id(self, kind: str, value) -> int:
        table = self._values[kind]
        k = repr(value)
        ident = table.get(k)
        if ident is None:
            ident = table[k] = len(table) + 1
        return ident

    def hard_id(self, ev: dict) -> int:
        sig = hard_signature(ev)
        ident = self._hard.get(sig)
        if ident is None:
            ident = self._hard[sig] = len(self.hard_obj)
            self.hard_obj.append(sig)
        return ident

    def key_id(self, ev: dict) -> int:
        key = pattern_key(ev)
        ident = self._key.get(key)
        if ident is None:
            ident = self._key[key] = len(self.key_obj)
            self.key_obj.append(key)
            self.site_obj.append(site_key(ev))
        return ident


def unique_rows(cols: list[np.ndarray], counts: bool = False, index: bool = False, inverse: bool = False):
    """np.unique of the rows made of these non-negative integer columns, fast: the columns are
    packed into one int64 (a mixed-radix number) and that is sorted, not the rows.
    Returns (rows as an (n, k) array, then counts, first index, inverse as asked)."""
    cols = [np.asarray(c, dtype=np.int64) for c in cols]
    dims = [int(c.max()) + 1 if len(c) else 1 for c in cols]
    if float(np.prod([float(d) for d in dims])) < 2**62:
        code = np.ravel_multi_index(cols, dims)
        got = np.unique(code, return_index=index, return_inverse=inverse, return_counts=counts)
        uniq = got[0] if isinstance(got, tuple) else got
        rows = np.stack(np.unravel_index(uniq, dims), axis=1) if len(uniq) else np.empty((0, len(cols)), np.int64)
    else:  # ids too large to pack: the slow, general way
        got = np.unique(
            np.stack(cols, axis=1), axis=0, return_index=index, return_inverse=inverse, return_counts=counts
        )
        rows = got[0] if isinstance(got, tuple) else got
    rest = list(got[1:]) if isinstance(got, tuple) else []
    if inverse:  # np.unique's order of extras: index, inverse, counts
        k = 1 if index else 0
        rest[k] = rest[k].reshape(-1)
    return (rows, *rest)


def _lookup(table: dict, values: np.ndarray, make: Callable[[int], int]) -> np.ndarray:
    """Map each local id in `values` through `make` (once per distinct id)."""
    uniq, inverse = np.unique(values, return_inverse=True)
    out = np.empty(len(uniq), dtype=np.int64)
    for i, v in enumerate(uniq.tolist()):
        got = table.get(v)
        if got is None:
            got = table[v] = make(v)
        out[i] = got
    return out[inverse]


class FileColumns:
    """One trace file's local ids mapped to the Interner's (filled as rows arrive)."""

    def __init__(self, interner: Interner, tables: dict, groups: dict):
        self.interner, self.tables, self.groups = interner, tables, groups
        self._combo: dict = {}  # (op, desc, ro, root, site) local -> (hard id, key id, op id, p2p)

    def _ids(self, combo: tuple) -> tuple[int, int, int, bool]:
        got = self._combo.get(combo)
        if got is None:
            op_l, desc_l, ro_l, root, site_l = combo
            name = self.tables["op"][op_l]
            d = self.tables["desc"][desc_l]
            s = self.tables["site"].get(site_l) if site_l else None
            ev = {
                "op": name,
                "sh": d.get("sh", []),
                "dt": d.get("dt", []),
                "ro": self.tables["ro"][ro_l] if ro_l else None,
                "label": None,
                "digest": None,
                "site": s.site if s else None,
                "fn": s.fn if s else None,
                "stack": list(s.stack) if s else [],
            }
            if root != -1:
                ev["root"] = root
            p2p = name in P2P_OPS or "p2p" in d
            it = self.interner
            got = self._combo[combo] = (
                it.hard_id(ev) if not p2p else -1,
                it.key_id(ev) if not p2p else -1,
                it.op_id(name),
                p2p,
            )
        return got

    def columns(self, rows: np.ndarray):
        """(hard, key, op, p2p mask) for rows of this file."""
        uniq, inverse = unique_rows(
            [rows["op"], rows["desc"], rows["ro"], rows["root"].astype(np.int64) + 1, rows["site"]], inverse=True
        )
        got = [self._ids((int(o), int(d), int(r), int(root) - 1, int(site))) for o, d, r, root, site in uniq.tolist()]
        hard = np.array([g[0] for g in got], dtype=np.int64)[inverse]
        key = np.array([g[1] for g in got], dtype=np.int64)[inverse]
        op = np.array([g[2] for g in got], dtype=np.int64)[inverse]
        p2p = np.array([g[3] for g in got], dtype=bool)[inverse]
        return hard, key, op, p2p


def foldable(rows: np.ndarray) -> np.ndarray:
    """Calls a column block can carry: whole, completed (a call still open or failed needs its dict)."""
    return (rows["kind"] == KIND_CALL) & (rows["state"] == STATE_COMPLETED)


def agreed_prefix(blocks: list[Block], hold: int) -> tuple[int, np.ndarray]:
    """(how many leading positions can be folded, the cross-site positions among them). Every
    block must have made an equal call at each (a call site alone may differ: a cross-site
    pairing, as the dict path's prune, pattern.py); a cross-site position is folded only when
    `hold` more agreed positions follow it (the window keeps it to locate a later divergence)."""
    n = min(len(b) for b in blocks)
    if n == 0:
        return 0, np.empty(0, dtype=np.int64)
    ref_h, ref_k = blocks[0].hard[:n], blocks[0].key[:n]
    ok = np.ones(n, dtype=bool)
    same_key = np.ones(n, dtype=bool)
    for b in blocks[1:]:
        ok &= b.hard[:n] == ref_h
        same_key &= b.key[:n] == ref_k
    bad = np.flatnonzero(~ok)
    agreed = int(bad[0]) if len(bad) else n
    cross = np.flatnonzero(~same_key[:agreed])
    late = cross[cross >= agreed - hold]
    stop = int(late[0]) if len(late) else agreed
    return stop, cross[cross < stop]
