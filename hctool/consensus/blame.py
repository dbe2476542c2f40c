"""From evidence to the cause: align two ranks' calls as sequences, find the first call
with no counterpart, and decide which rank's path deviated (docs/consensus.md "Cause and
culprit").

Alignment (`align`). Two ranks' calls in one channel are aligned by a small weighted edit
distance, banded around the diagonal: equal calls from the same place cost nothing, equal calls
from different places (a cross-site pairing: Join's shadow all-reduces, rank-0-first
barriers) cost CROSS, a call with no counterpart costs GAP, calls at one place that differ
(shapes, reduce op, ...) cost MISMATCH, and calls that differ and come from different places
are never paired (two gaps are cheaper). A rank still running may yet make the calls its peer
is ahead by: those are pending, not gaps. The first gap or mismatch of the cheapest alignment
is the cause, however many calls before the symptom it happened: an extra call that paired
silently with the peer's next same-shape call leaves the inserting rank one call ahead, and
only the alignment that skips it lines the rest up again.

Culprit (`explain_pair`). A call with no counterpart says two ranks parted, not which one
deviated: rank A's extra call and rank B's skipped call read the same. What decides it:
1. the program's own pattern: how often each rank's next call followed the previous one so
   far in this channel (both ranks' history); the rank that took a path the channel never or
   rarely took deviated;
2. the program's structure (structure.py, from the source): a rank that branched into a
   conditional call the other's path is outside of; a rank that is past the loop its peer
   still repeats in: then the ranks disagree on a loop's trip count, and the loop decides: one
   that can end early or skip its call on a rank-local condition (a deadline, a poll, an
   exception) names the rank that left or skipped, one that ends when its data runs out
   names the rank with the extra turn;
3. program order in their common function, as a last resort (the earlier call is the
   extra one: the other rank went past it), said with low confidence.
Each answer carries its confidence and a sentence saying what decided it.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from hctool.consensus.pattern import ROOTED, hard_signature, pattern_key
from hctool.consensus.structure import SourceMap, common_level, frames_of

GAP, CROSS, MISMATCH, UNRELATED = 1.0, 0.5, 1.0, 2.5
BAND = 32  # diagonals beyond the length difference searched (insertions per window)
MAX_ALIGN = 2048  # calls per rank aligned around the evidence (bounded work on long windows)
END = ("<end>",)  # a rank that ended: the pattern key of "no more calls"


class Op(NamedTuple):
    kind: str  # "match" | "cross" | "gap_a" (a's call unmatched) | "gap_b" | "mismatch" | "pending"
    i: int | None  # index in a
    j: int | None  # index in b


class Verdict(NamedTuple):
    """Who deviated at the first unmatched call, and why we think so."""

    kind: str  # extra | missing | op | shape | dtype | reduce_op | root | label
    culprits: list[int]
    cause_rank: int  # the rank holding the call with no counterpart (or both's: the culprit)
    cause_index: int  # that call's index in the cause rank's window
    index: int  # window index whose calls each rank made at the divergence (transport pairing)
    confidence: str  # "high" | "medium" | "low"
    basis: str  # what decided it, in words
    alternative: str | None = None  # the other reading, where the evidence is symmetric


# ------------------------------------------------------------------ alignment


def _cost(p: dict, q: dict) -> float:
    if hard_signature(p) == hard_signature(q):
        return 0.0 if pattern_key(p) == pattern_key(q) else CROSS
    if pattern_key(p) == pattern_key(q) and p.get("op") == q.get("op"):
        return MISMATCH
    return UNRELATED


def align(a: list, b: list, a_closed: bool, b_closed: bool) -> list[Op]:
    """The cheapest alignment of a and b (banded edit distance). A closed sequence will get no
    more calls: the other's surplus is unmatched; an open one may still make them (pending).
    On equal cost, a gap goes as late as it can (into the last turn of a uniform run)."""
    n, m = len(a), len(b)
    band = abs(n - m) + BAND
    inf = float("inf")
    # dp[i] maps j -> (cost, move) for |i - j| <= band
    dp: list[dict[int, tuple[float, str]]] = [dict() for _ in range(n + 1)]
    dp[0][0] = (0.0, "")
    for j in range(1, min(m, band) + 1):
        dp[0][j] = (j * GAP, "b")
    for i in range(1, n + 1):
        row, prev = dp[i], dp[i - 1]
        for j in range(max(0, i - band), min(m, i + band) + 1):
            best = (inf, "")
            if j > 0 and (j - 1) in prev:
                best = min(best, (prev[j - 1][0] + _cost(a[i - 1], b[j - 1]), "d"))
            if j in prev:
                best = min(best, (prev[j][0] + GAP, "a"))  # a[i-1] has no counterpart
            if j > 0 and (j - 1) in row:
                best = min(best, (row[j - 1][0] + GAP, "b"))
            row[j] = best
    # where the alignment may end: an open sequence leaves the other's tail pending
    ends = [(n, m)]
    if not b_closed:
        ends += [(i, m) for i in range(max(0, m - band), n) if m in dp[i]]
    if not a_closed:
        ends += [(n, j) for j in range(max(0, n - band), m) if j in dp[n]]
    if not a_closed and not b_closed:
        ends = [(i, j) for i in range(n + 1) for j in dp[i] if i == n or j == m]
    end = min(ends, key=lambda ij: (dp[ij[0]][ij[1]][0], -(ij[0] + ij[1])))
    ops: list[Op] = [Op("pending", i, None) for i in range(end[0], n)] + [
        Op("pending", None, j) for j in range(end[1], m)
    ]
    i, j = end
    while i > 0 or j > 0:
        cost, move = dp[i][j]
        # on a tie, prefer the gap (the latest position for it in a run of equal calls)
        if move == "d" and i > 0 and j in dp[i - 1] and abs(dp[i - 1][j][0] + GAP - cost) < 1e-9:
            move = "a"
        elif move == "d" and j > 0 and (j - 1) in dp[i] and abs(dp[i][j - 1][0] + GAP - cost) < 1e-9:
            move = "b"
        if move == "d":
            c = _cost(a[i - 1], b[j - 1])
            ops.append(Op("match" if c == 0 else "cross" if c == CROSS else "mismatch", i - 1, j - 1))
            i, j = i - 1, j - 1
        elif move == "a":
            ops.append(Op("gap_a", i - 1, None))
            i -= 1
        else:
            ops.append(Op("gap_b", None, j - 1))
            j -= 1
    ops.reverse()
    return [o for o in ops if o.kind != "pending"] + [o for o in ops if o.kind == "pending"]


def first_break(ops: list[Op]) -> tuple[int, Op] | None:
    for k, op in enumerate(ops):
        if op.kind in ("gap_a", "gap_b", "mismatch"):
            return k, op
    return None


# ------------------------------------------------------------------ the pattern


class History:
    """What a channel's calls did so far, per place (pattern key): how often each call followed
    each other (both ranks summed), how long each run of one call lasted before the next one
    (an inner loop's trip count per outer turn), and how often each rank called from each place.
    Bounded by the program's call sites."""

    LIMIT = 4096

    def __init__(self) -> None:
        self.pairs: Counter = Counter()  # (key, next key) -> times
        self.out: Counter = Counter()  # key -> times followed by anything
        self.runs: dict[tuple, Counter] = {}  # (key, next key) -> run length of key before it -> times
        self.counts: dict[int, Counter] = {}  # rank -> key -> calls
        self.current: dict[int, tuple] = {}  # rank -> (key, run length so far)
        self.sigs: dict = {}  # key -> hard signatures its calls had (what "usual" is here)

    def copy(self) -> History:
        h = History()
        h.pairs, h.out = Counter(self.pairs), Counter(self.out)
        h.runs = {k: Counter(v) for k, v in self.runs.items()}
        h.counts = {r: Counter(c) for r, c in self.counts.items()}
        h.current = dict(self.current)
        h.sigs = {k: set(v) for k, v in self.sigs.items()}
        return h

    def learn(self, rank: int, ev: dict) -> None:
        key = pattern_key(ev)
        sigs = self.sigs.get(key)
        if sigs is None and len(self.sigs) < self.LIMIT:
            sigs = self.sigs[key] = set()
        if sigs is not None and len(sigs) < 8:
            sigs.add(hard_signature(ev))
        counts = self.counts.setdefault(rank, Counter())
        if key in counts or len(counts) < self.LIMIT:
            counts[key] += 1
        cur = self.current.get(rank)
        if cur is not None:
            pair = (cur[0], key)
            if pair in self.pairs or len(self.pairs) < self.LIMIT:
                self.pairs[pair] += 1
                self.out[cur[0]] += 1
            if key != cur[0]:
                runs = (
                    self.runs.setdefault(pair, Counter())
                    if (pair in self.runs or len(self.runs) < self.LIMIT)
                    else None
                )
                if runs is not None and (cur[1] in runs or len(runs) < 8):
                    runs[cur[1]] += 1
        self.current[rank] = (key, cur[1] + 1 if cur is not None and cur[0] == key else 1)

    def learn_block(self, rank: int, keys, hards, key_obj: list, hard_obj: list) -> None:
        """learn() for a run of calls given as id arrays (columns.py): the same counts, in bulk."""
        import numpy as np

        n = len(keys)
        if n == 0:
            return
        counts = self.counts.setdefault(rank, Counter())
        uk, uc = np.unique(keys, return_counts=True)
        for k, c in zip(uk.tolist(), uc.tolist()):
            obj = key_obj[k]
            if obj in counts or len(counts) < self.LIMIT:
                counts[obj] += c
        from hctool.consensus.columns import unique_rows

        for k, h in unique_rows([keys, hards])[0].tolist():
            obj = key_obj[k]
            sigs = self.sigs.get(obj)
            if sigs is None and len(self.sigs) < self.LIMIT:
                sigs = self.sigs[obj] = set()
            if sigs is not None and len(sigs) < 8:
                sigs.add(hard_obj[h])
        cur = self.current.get(rank)
        first = key_obj[int(keys[0])]
        if cur is not None:
            self._pair(cur[0], first, 1)
        if n > 1:
            pairs, pc = unique_rows([keys[:-1], keys[1:]], counts=True)
            for (a, b), c in zip(pairs.tolist(), pc.tolist()):
                self._pair(key_obj[a], key_obj[b], c)
        # run lengths: runs of one key, each followed by the next run's key
        change = np.flatnonzero(keys[1:] != keys[:-1]) + 1
        starts = np.concatenate([[0], change])
        lengths = np.diff(np.concatenate([starts, [n]]))
        run_keys = keys[starts]
        if cur is not None and cur[0] == first:
            lengths = lengths.copy()
            lengths[0] += cur[1]
        elif cur is not None:
            self._run(cur[0], first, cur[1], 1)
        if len(run_keys) > 1:
            trip, tc = unique_rows([run_keys[:-1], run_keys[1:], lengths[:-1]], counts=True)
            for (a, b, length), c in zip(trip.tolist(), tc.tolist()):
                self._run(key_obj[a], key_obj[b], length, c)
        self.current[rank] = (key_obj[int(run_keys[-1])], int(lengths[-1]))

    def _pair(self, a, b, c: int) -> None:
        pair = (a, b)
        if pair in self.pairs or len(self.pairs) < self.LIMIT:
            self.pairs[pair] += c
            self.out[a] += c

    def _run(self, a, b, length: int, c: int) -> None:
        pair = (a, b)
        runs = self.runs.setdefault(pair, Counter()) if (pair in self.runs or len(self.runs) < self.LIMIT) else None
        if runs is not None and (length in runs or len(runs) < 8):
            runs[length] += c

    def count(self, prev, cur) -> int:
        return self.pairs.get((prev, cur), 0)

    def share(self, prev, cur) -> float:
        total = self.out.get(prev, 0)
        return self.pairs.get((prev, cur), 0) / total if total else 0.0

    def calls(self, rank: int, key) -> int:
        return self.counts.get(rank, Counter()).get(key, 0)


def _key(ev: dict | None):
    return END if ev is None else pattern_key(ev)


def _where(ev: dict | None) -> str:
    if ev is None:
        return "the end of its run"
    return f"{ev.get('op')} at {ev.get('site') or '?'}"


# ------------------------------------------------------------------ who deviated


class PairView:
    """Two ranks' window sequences in one channel and what is known around them."""

    def __init__(
        self, ra: int, rb: int, a: list, b: list, prev_a, prev_b, ended: dict, history: History, sources: SourceMap
    ):
        self.r = (ra, rb)
        self.seq = (a, b)
        self.prev = (prev_a, prev_b)
        self.ended = ended
        self.sources = sources
        self.committed = history  # the dropped prefix's (each rank's calls before the window)
        self.trans = history.copy()  # plus the window's calls before the divergence

    def learn_until(self, ia: int, ib: int) -> None:
        """Add the window's calls before the divergence to the channel's history."""
        for side, upto in ((0, ia), (1, ib)):
            for ev in self.seq[side][:upto]:
                self.trans.learn(self.r[side], ev)

    def before(self, side: int, idx: int):
        seq = self.seq[side]
        return seq[idx - 1] if idx > 0 else self.prev[side]

    def at(self, side: int, idx: int):
        seq = self.seq[side]
        return seq[idx] if idx < len(seq) else None

    def occurrences(self, side: int, idx: int, key) -> int:
        """How often this rank made a call from this place before index idx (its turn count)."""
        return self.committed.calls(self.r[side], key) + sum(1 for e in self.seq[side][:idx] if pattern_key(e) == key)

    def run_before(self, side: int, idx: int, key) -> int:
        """How many calls from this place the rank made in a row right before index idx."""
        n, seq = 0, self.seq[side]
        while n < idx and pattern_key(seq[idx - 1 - n]) == key:
            n += 1
        if n == idx:
            cur = self.committed.current.get(self.r[side])
            if cur is not None and cur[0] == key:
                n += cur[1]
        return n


def explain_pair(view: PairView, ops: list[Op], stuck: bool) -> Verdict | None:
    hit = first_break(ops)
    if hit is None:
        return None
    k, op = hit
    ra, rb = view.r
    a, b = view.seq
    if op.kind == "mismatch":
        return _mismatch(view, op.i, op.j)
    # index of each rank's call at the break, and whether the other rank's call there is unmatched too
    if op.kind == "gap_a":
        ia = op.i
        ib = _next_index(ops, k, "j", len(b))
    else:
        ib = op.j
        ia = _next_index(ops, k, "i", len(a))
    orphan = _orphan_place(view, ops, k, op)
    if orphan is not None:
        return orphan
    view.learn_until(ia, ib)
    nxt = ops[k + 1] if k + 1 < len(ops) else None
    both = (
        nxt is not None
        and {op.kind, nxt.kind} == {"gap_a", "gap_b"}
        and ((op.kind == "gap_a" and nxt.j == ib) or (op.kind == "gap_b" and nxt.i == ia))
    )
    if both:
        return _both_unmatched(view, ia, ib)
    holder = 0 if op.kind == "gap_a" else 1
    resynced = sum(1 for o in ops[k + 1 :] if o.kind in ("match", "cross"))
    return _one_unmatched(view, holder, ia if holder == 0 else ib, ib if holder == 0 else ia, resynced)


def explain_against(view: PairView, ops: list[Op]) -> tuple[str, int, int] | None:
    """Side 0 is an odd rank out, side 1 a rank of the majority (the truth): (kind, side of the
    cause call, its index) at the first break of their alignment."""
    hit = first_break(ops)
    if hit is None:
        return None
    k, op = hit
    a, b = view.seq
    nxt = ops[k + 1] if k + 1 < len(ops) else None
    if op.kind == "mismatch":
        return diff_kind(a[op.i], b[op.j]), 0, op.i
    if nxt is not None and {op.kind, nxt.kind} == {"gap_a", "gap_b"}:
        ia, jb = (op.i, nxt.j) if op.kind == "gap_a" else (nxt.i, op.j)
        view.learn_until(ia, jb)
        if _trip(view, 1, jb, 0, ia) is not None:
            return "missing", 1, jb  # the odd rank left the loop the majority still repeats in
        if _trip(view, 0, ia, 1, jb) is not None:
            return "extra", 0, ia  # the odd rank took a turn more
        return diff_kind(a[ia], b[jb]), 0, ia
    if op.kind == "gap_a":
        return "extra", 0, op.i
    ia = _next_index(ops, k, "i", len(a))
    if (
        ia < len(a)
        and op.j + 1 < len(b)
        and hard_signature(a[ia]) == hard_signature(b[op.j + 1])
        and pattern_key(a[ia]) != pattern_key(b[op.j + 1])
    ):
        # the odd rank made, from another place, the call the others make next: it took two calls in
        # the other order (a flag that flips the order on one rank), its first one is the cause
        return diff_kind(a[ia], b[op.j]), 0, ia
    return "missing", 1, op.j


def _orphan_place(view: PairView, ops: list[Op], k: int, op: Op) -> Verdict | None:
    """The unmatched call comes from a place its peer never made a call from, and every earlier
    call from there paired across sites (with the peer's calls from another place): the first of
    them is where the ranks parted, not the one left over at the end (DDP's no_sync() on one rank
    only: the other's accumulation all-reduces pair with its step all-reduces until it hangs)."""
    side = 0 if op.kind == "gap_a" else 1
    other = 1 - side
    ix = op.i if side == 0 else op.j
    seq = view.seq[side]
    key = pattern_key(seq[ix])
    if view.committed.calls(view.r[other], key) or view.committed.calls(view.r[side], key):
        return None  # a place with history before the window: the pattern rules weigh it
    if any(pattern_key(e) == key for e in view.seq[other]):
        return None
    first = None
    for o in ops[:k]:
        mine = o.i if side == 0 else o.j
        if mine is None or pattern_key(seq[mine]) != key:
            continue
        if o.kind != "cross":
            return None  # a call from there that matched, or that was left over earlier: not this shape
        if first is None:
            first = o
    if first is None:
        return None
    fx = first.i if side == 0 else first.j
    peer = view.seq[other][first.j if side == 0 else first.i]
    rs, ro = view.r[side], view.r[other]
    return Verdict(
        "extra",
        [rs],
        rs,
        fx,
        fx,
        "medium",
        f"rank {rs}'s {_where(seq[fx])} has no counterpart from there on rank {ro}, which made no call from "
        f"that place: it paired with rank {ro}'s {_where(peer)}, and every later call from there did the "
        f"same until the ranks parted",
        alternative=f"rank {ro} skipped every call from {seq[fx].get('site') or '?'}",
    )


def _next_index(ops: list[Op], k: int, field: str, default: int) -> int:
    for o in ops[k:]:
        v = getattr(o, field)
        if v is not None:
            return v
    return default


def _mismatch(view: PairView, ia: int, ib: int) -> Verdict:
    """The ranks made a call at one place that differs (shapes, dtypes, reduce op...)."""
    a, b = view.seq
    ea, eb = a[ia], b[ib]
    kind = diff_kind(ea, eb)
    ra, rb = view.r
    # a shape this place had before on both ranks is not the odd one out
    root = ea.get("root") if ea.get("op") in ROOTED else None
    if root in view.r and root == eb.get("root"):
        # a rooted call: what the root sends (or gathers into) is what the others must match
        culprit = rb if root == ra else ra
        side = 1 if culprit == rb else 0
        return Verdict(
            kind,
            [culprit],
            culprit,
            ib if side else ia,
            ia,
            "high",
            f"rank {culprit}'s {_where(eb if side else ea)} differs in {kind.replace('_', ' ')} from "
            f"what its root, rank {root}, made",
        )
    view.learn_until(ia, ib)
    seen = view.trans.sigs.get(pattern_key(ea), set())
    known_a, known_b = hard_signature(ea) in seen, hard_signature(eb) in seen
    if known_a != known_b:
        culprit, side = (rb, 1) if known_a else (ra, 0)
        return Verdict(
            kind,
            [culprit],
            culprit,
            ib if side else ia,
            ia,
            "medium",
            f"rank {culprit}'s {kind.replace('_', ' ')} at {_where(eb if side else ea)} differs from "
            f"what this call had on every rank before",
        )
    return Verdict(
        kind,
        sorted(view.r),
        ra,
        ia,
        ia,
        "low",
        f"both ranks made this call with a different {kind.replace('_', ' ')}; which one is right is not in the traces",
    )


def diff_kind(a: dict, b: dict) -> str:
    from hctool.consensus.pattern import HARD_FIELDS, field

    if "dir" in a or "dir" in b:
        sa, sb = hard_signature(a), hard_signature(b)
        if sa[:2] != sb[:2]:
            return "op"
        return "shape" if sa[2] != sb[2] else "dtype"
    for f, kind in HARD_FIELDS:
        if field(a, f) != field(b, f):
            return kind
    return "site"


def _one_unmatched(view: PairView, holder: int, ix: int, iy: int, resynced: int) -> Verdict:
    """One rank's call x (index ix) has no counterpart; the other's next call is y (index iy, or
    its end). Either the holder inserted x, or the other skipped it."""
    other = 1 - holder
    rh, ro = view.r[holder], view.r[other]
    x, y = view.at(holder, ix), view.at(other, iy)
    px, py = view.before(holder, ix), view.before(other, iy)
    kx, ky = _key(x), _key(y)
    if y is None and view.ended.get(ro) not in (None, "clean"):
        # the other rank died on its own before making the call: its exit is the cause
        return Verdict(
            "missing",
            [ro],
            rh,
            ix,
            ix,
            "high",
            f"rank {ro} ended ({view.ended.get(ro)}) without making the call rank {rh} made",
        )
    trip = _trip(view, holder, ix, other, iy)
    if trip is not None:
        return trip
    t_ins = view.trans.count(_key(px), kx)  # the holder's path: px -> x
    t_skip = view.trans.count(_key(py), ky)  # the other's path: py -> y, past x
    t_succ = view.trans.count(kx, ky)  # x is usually followed by y
    if t_ins == 0 and t_skip > 0:
        conf = "high" if resynced and t_skip >= 2 else "medium"
        return Verdict(
            "extra",
            [rh],
            rh,
            ix,
            ix,
            conf,
            f"rank {rh}'s {_where(x)} has no counterpart on rank {ro}: no call from there had followed "
            f"the {_where(px)} before, while the call rank {ro} made next had, {t_skip} time(s)"
            + (f"; without it the rest lines up again ({resynced} calls)" if resynced else ""),
        )
    if t_skip == 0 and t_ins > 0 and (t_succ > 0 or y is None):
        return Verdict(
            "missing",
            [ro],
            rh,
            ix,
            ix,
            "high" if t_ins >= 2 else "medium",
            f"rank {ro} skipped the {_where(x)} that rank {rh} made: it always followed "
            f"{_where(px)} before ({t_ins} time(s)), and rank {ro} went on to {_where(y)}",
        )
    # the pattern does not decide: the program's structure
    region = _conditional_region(view, holder, ix, other, iy)
    if region is not None:
        return Verdict(
            "extra",
            [rh],
            rh,
            ix,
            ix,
            "medium",
            f"rank {rh}'s {_where(x)} sits in a branch (line {region.start}) that rank {ro}'s path does not enter",
        )
    skip = _skip_path(view, holder, ix)
    if skip is not None:
        return Verdict(
            "missing",
            [ro],
            rh,
            ix,
            ix,
            "medium",
            f"rank {ro} skipped the {_where(x)} that rank {rh} made: the loop's {skip.how} at line "
            f"{skip.line} ({skip.why}) can skip it on one rank",
        )
    return Verdict(
        "extra",
        [rh],
        rh,
        ix,
        ix,
        "low",
        f"rank {rh}'s {_where(x)} has no counterpart on rank {ro}",
        alternative=f"rank {ro} skipped that call",
    )


def _both_unmatched(view: PairView, ia: int, ib: int) -> Verdict:
    """Each rank made a call the other has no counterpart for, at one point (both stopped there):
    one of them branched or left a loop."""
    ra, rb = view.r
    ea, eb = view.at(0, ia), view.at(1, ib)
    ta = view.trans.count(_key(view.before(0, ia)), _key(ea))
    tb = view.trans.count(_key(view.before(1, ib)), _key(eb))
    sa = view.trans.share(_key(view.before(0, ia)), _key(ea))
    sb = view.trans.share(_key(view.before(1, ib)), _key(eb))
    # one rank past the loop its peer still repeats in: a trip count, decided by the loop
    for side in (0, 1):
        trip = _trip(view, side, ia if side == 0 else ib, 1 - side, ib if side == 0 else ia)
        if trip is not None:
            return trip
    dev = None
    if ta == 0 and tb > 0 or (ta > 0 and tb > 0 and sa * 4 <= sb):
        dev = 0
    elif tb == 0 and ta > 0 or (ta > 0 and tb > 0 and sb * 4 <= sa):
        dev = 1
    if dev is not None:
        rd, ro = view.r[dev], view.r[1 - dev]
        ed, eo = (ea, eb) if dev == 0 else (eb, ea)
        td, to = (ta, tb) if dev == 0 else (tb, ta)
        idx = ia if dev == 0 else ib
        return Verdict(
            "extra",
            [rd],
            rd,
            idx,
            idx,
            "high" if td == 0 and to >= 2 else "medium",
            f"rank {rd}'s {_where(ed)} broke the pattern this group kept: "
            + (
                f"no call from there had followed the {_where(view.before(dev, idx))} before"
                if td == 0
                else f"a call from there had followed the {_where(view.before(dev, idx))} {td} time(s)"
            )
            + f", while rank {ro}'s next call ({_where(eo)}) had, {to} time(s)",
        )
    for side in (0, 1):
        other = 1 - side
        i_s, i_o = (ia, ib) if side == 0 else (ib, ia)
        region = _conditional_region(view, side, i_s, other, i_o)
        region_o = _conditional_region(view, other, i_o, side, i_s)
        if region is not None and region_o is None:
            r = view.r[side]
            return Verdict(
                "extra",
                [r],
                r,
                i_s,
                i_s,
                "medium",
                f"rank {r}'s {_where(view.at(side, i_s))} sits in a branch (line {region.start}) that "
                f"rank {view.r[other]}'s path does not enter; rank {view.r[other]} went on to "
                f"{_where(view.at(other, i_o))}",
            )
    # two arms of one if/else: which comes first in the file says nothing about which rank deviated
    arms = [_conditional_region(view, 0, ia, 1, ib), _conditional_region(view, 1, ib, 0, ia)]
    exclusive = all(arms) and arms[0].node is not None and arms[0].node is arms[1].node and arms[0].kind != arms[1].kind
    earlier = None if exclusive else _program_order(ea, eb)
    if earlier is not None:
        r = view.r[earlier]
        idx = ia if earlier == 0 else ib
        o = view.r[1 - earlier]
        return Verdict(
            "extra",
            [r],
            r,
            idx,
            idx,
            "low",
            f"rank {r}'s {_where(view.at(earlier, idx))} comes first in their common function; rank {o} "
            f"went past it to {_where(view.at(1 - earlier, ib if earlier == 0 else ia))}",
            alternative=f"rank {o} made an extra call at {_where(view.at(1 - earlier, ib if earlier == 0 else ia))}",
        )
    if exclusive:
        return Verdict(
            diff_kind(ea, eb),
            sorted(view.r),
            ra,
            ia,
            ia,
            "low",
            f"the ranks took the two arms of one if/else (line {arms[0].node.lineno}): rank {ra} "
            f"{_where(ea)}, rank {rb} {_where(eb)}; which arm was right is not in the traces",
        )
    return Verdict(
        diff_kind(ea, eb),
        sorted(view.r),
        ra,
        ia,
        ia,
        "low",
        "each rank made a call the other did not; nothing in the traces or the source says which one deviated",
    )


def explain_cycle(ea: dict, eb: dict, sources: SourceMap, made=None) -> tuple[int, str, str] | None:
    """Two ranks each wait, in different channels, for the other (a wait cycle). made: per side
    (this rank's calls of that kind before, the other rank's, whether its channel never saw the
    call's place). Returns (side of the call that decides, "extra" | "missing", why), or None:
    the cycle itself (both waiting calls are one statement, an if/else pair of sends...).
    - a call neither rank ever made, against one both made before: the new one is extra;
    - two calls both ranks made equally often before: the earlier one in their common function
      is the one the other rank skipped this time (it is past it);
    - a call that sits in a branch the other rank's path is outside of: that rank made an extra
      call (a rank-0-only new_group, an extra barrier);
    - a call from a place its channel never used, while the other's place was used: extra."""
    evs = (ea, eb)
    made = made or [(0, 0, False), (0, 0, False)]
    fa, fb = frames_of(ea), frames_of(eb)
    lvl = common_level(fa, fb)
    if lvl is not None and fa[lvl[0]].line == fb[lvl[1]].line:
        return None  # one statement on both ranks (both send first): the cycle itself
    new = [m[0] == 0 and m[1] == 0 for m in made]
    usual = [m[0] >= 1 and m[0] == m[1] for m in made]
    for side in (0, 1):
        if new[side] and usual[1 - side]:
            return (
                side,
                "extra",
                (
                    f"neither rank had made the {_where(evs[side])} before, while both had made the "
                    f"{_where(evs[1 - side])} {made[1 - side][0]} time(s)"
                ),
            )
    if all(usual) and lvl is not None:
        side = 0 if fa[lvl[0]].line < fb[lvl[1]].line else 1
        return (
            side,
            "missing",
            (
                f"both ranks always made both calls before ({made[side][0]} time(s)); the "
                f"{_where(evs[side])} comes first in their common function, and the other rank is "
                f"past it, at {_where(evs[1 - side])}"
            ),
        )
    if lvl is not None:
        ra = sources.conditional(fa, lvl[0], fb[lvl[1]].line)
        rb = sources.conditional(fb, lvl[1], fa[lvl[0]].line)
        if (ra is None) != (rb is None):
            side, region = (0, ra) if ra is not None else (1, rb)
            return (
                side,
                "extra",
                (
                    f"the {_where(evs[side])} sits in a branch (line {region.start}) that the other "
                    f"rank's path does not enter"
                ),
            )
    if made[0][2] != made[1][2]:
        side = 0 if made[0][2] else 1
        return side, "extra", f"the {_where(evs[side])} comes from a place its group never used before"
    return None


def _trip(view: PairView, rep: int, irep: int, dev: int, idev: int) -> Verdict | None:
    """rank `rep`'s call (index irep) repeats inside a loop that rank `dev`'s next call (or its end)
    is past: the ranks disagree on how many turns the loop takes. The loop decides who is wrong."""
    x, y = view.at(rep, irep), view.at(dev, idev)
    if x is None:
        return None
    turns = view.occurrences(rep, irep, pattern_key(x))
    if turns == 0:
        return None  # not seen turning: a first call, not a repeat
    if y is None and view.ended.get(view.r[dev]) != "clean":
        return None
    fx = frames_of(x)
    found = view.sources.loops_left(fx, frames_of(y) if y is not None else None)
    if found is None:
        return None
    li, loop, loops = found
    rr, rd = view.r[rep], view.r[dev]
    # An inner loop seen before: how many calls each earlier run of it made before the call the
    # leaving rank went on to. A run length that always held names the rank that broke it.
    kx = pattern_key(x)
    runs = view.trans.runs.get((kx, _key(y)))
    if runs and len(runs) == 1 and sum(runs.values()) >= 2:
        (usual,) = runs
        now_rep, now_dev = view.run_before(rep, irep, kx) + 1, view.run_before(dev, idev, kx)
        if now_dev == usual < now_rep:
            return Verdict(
                "extra",
                [rr],
                rr,
                irep,
                irep,
                "high",
                f"rank {rr} made {now_rep} calls of {_where(x)} in a row where every earlier run made "
                f"{usual} before {_where(y)} ({sum(runs.values())} runs), as rank {rd} did now",
            )
        if now_dev < usual:
            return Verdict(
                "missing",
                [rd],
                rr,
                irep,
                irep,
                "high",
                f"rank {rd} went on to {_where(y)} after {now_dev} calls of {_where(x)} where every "
                f"earlier run made {usual} ({sum(runs.values())} runs); rank {rr} made its call a "
                f"{now_rep}th time",
            )
    path = fx[li].path
    # ways one rank's turn can end early or skip the call: the loops' own exits, and early returns
    # of the functions on the call's path below the loop (a poll that returns without voting)
    exits = [e for lp in loops for e in view.sources.exits(lp) if e.rank_local]
    exits += [e for f in fx[li + 1 :] for e in view.sources.early_returns(f) if e.rank_local]
    exits += [e for f in fx[li:] for e in view.sources.caught(f)]
    name = f"{path.rsplit('/', 1)[-1]}:{loop.start}"
    if exits:
        e = exits[0]
        return Verdict(
            "missing",
            [rd],
            rr,
            irep,
            irep,
            "medium",
            f"rank {rd} left the loop at {name} early or skipped a turn's call ({turns} vs {turns + 1} "
            f"calls of {_where(x)}) and went on to {_where(y)}: the loop can end or skip on one rank, "
            f"{e.how} at line {e.line} ({e.why})",
            alternative=f"rank {rr} took one turn more than rank {rd}",
        )
    return Verdict(
        "extra",
        [rr],
        rr,
        irep,
        irep,
        "medium",
        f"rank {rr} took one more turn of the loop at {name} ({turns + 1} vs {turns} calls of {_where(x)}); "
        f"rank {rd} went on to {_where(y)}. Nothing in the loop ends or skips it on one rank, so the ranks "
        f"had different amounts of work (data)",
        alternative=f"rank {rd} left the loop early",
    )


def _conditional_region(view: PairView, side: int, i_s: int, other: int, i_o: int):
    """The branch around this rank's call that the other rank's path (its next call) is not in."""
    x, y = view.at(side, i_s), view.at(other, i_o)
    if x is None:
        return None
    fx = frames_of(x)
    if y is None:
        return view.sources.conditional(fx, 0, None) if fx else None
    fy = frames_of(y)
    lvl = common_level(fx, fy)
    if lvl is None:
        return None
    ia, ib = lvl
    return view.sources.conditional(fx, ia, fy[ib].line)


def _skip_path(view: PairView, holder: int, ix: int):
    x = view.at(holder, ix)
    if x is None:
        return None
    fx = frames_of(x)
    found = view.sources.innermost_loop(fx)
    if found is None:
        return None
    li, loop = found
    exits = [e for e in view.sources.exits(loop) if e.how in ("continue", "return", "break") and e.line <= fx[li].line]
    exits += [e for f in fx[li:] for e in view.sources.caught(f)]
    local = [e for e in exits if e.rank_local]
    return (local or exits or [None])[0]


def _program_order(ea: dict, eb: dict) -> int | None:
    fa, fb = frames_of(ea), frames_of(eb)
    lvl = common_level(fa, fb)
    if lvl is None:
        return None
    la, lb = fa[lvl[0]].line, fb[lvl[1]].line
    if la == lb:
        return None
    return 0 if la < lb else 1
