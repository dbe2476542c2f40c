"""Aligning the per-rank sequences of each group and naming the first divergence.

A channel is what must agree: a process group's collectives (members = its
rank set), the labelled events of assert_same ("labels", all ranks), or the
p2p traffic between two ranks of a group. Each rank's channel sequence is a
list; the agreed-and-completed prefix is dropped as it goes (live mode keeps
memory bounded) and `base` counts what was dropped, so seq = base + index.
At the first index where ranks disagree, the cost of three explanations is
compared over the rest of the sequences (a small diff): rank A inserted a
call, rank B inserted one, or the two calls differ.
"""

from __future__ import annotations

import json
from collections import deque

from hctool.consensus.waits import Waits

ROOTED = {"broadcast", "reduce", "gather", "scatter", "broadcast_object_list", "gather_object",
          "scatter_object_list"}
KIND_FIELDS = (("op", "op"), ("sh", "shape"), ("dt", "dtype"), ("ro", "reduce_op"), ("root", "root"),
               ("label", "label"), ("digest", "label"), ("site_key", "site"))


def signature(ev: dict) -> tuple:
    if "dir" in ev:  # p2p: both sides describe the same flow
        flow = (ev["rank"], ev["peer"]) if ev["dir"] == "send" else (ev["peer"], ev["rank"])
        return ("p2p", flow, _freeze(ev["sh"]), tuple(ev["dt"]))
    return tuple(_freeze(ev.get(f)) if f != "site_key" else site_key(ev) for f, _ in KIND_FIELDS)


def site_key(ev: dict):
    # Root and non-root ranks legitimately reach a rooted op from different lines
    # of one function (`if rank == src: ... broadcast(...) else: ... broadcast(...)`).
    if ev.get("op") in ROOTED and ev.get("site"):
        return (ev["site"].rsplit(":", 1)[0], ev.get("fn"))
    return ev.get("site")


def _freeze(x):
    return json.dumps(x, sort_keys=True) if isinstance(x, (list, dict)) else x


def diff_kind(a: dict, b: dict) -> str:
    if "dir" in a or "dir" in b:
        sa, sb = signature(a), signature(b)
        if sa[:2] != sb[:2]:
            return "op"
        return "shape" if sa[2] != sb[2] else "dtype"
    for f, kind in KIND_FIELDS:
        va = site_key(a) if f == "site_key" else a.get(f)
        vb = site_key(b) if f == "site_key" else b.get(f)
        if _freeze(va) != _freeze(vb):
            return kind
    return "site"


def channel_members(gkey: str, known: dict[str, list[int]]) -> list[int] | None:
    if gkey in known:
        return known[gkey]
    try:
        return json.loads(gkey.split(" p2p ")[0].split(":", 1)[1])
    except (IndexError, ValueError):
        return None


class Channel:
    def __init__(self, key: str, members: list[int] | None):
        self.key = key
        self.members = members
        self.seqs: dict[int, deque] = {}
        self.base = 0
        self.last_arrival = 0.0
        self.prev: dict[int, dict] = {}  # last dropped event per rank (loop heuristic)
        self.seen_sites: set = set()      # call sites of the agreed prefix (bounded by the program's sites)
        self.seen_pairs: set = set()      # (site, next site) pairs of the agreed prefix (same bound, squared)

    def add(self, ev: dict, now: float) -> None:
        self.seqs.setdefault(ev["rank"], deque()).append(ev)
        self.last_arrival = now

    def member_ranks(self, all_ranks: list[int]) -> list[int]:
        return self.members if self.members is not None else all_ranks

    def prune(self, all_ranks: list[int]) -> None:
        """Drop the prefix on which every member agrees and has completed."""
        ranks = self.member_ranks(all_ranks)
        seqs = [self.seqs.get(r) for r in ranks]
        if len(ranks) < 2 or any(not s for s in seqs):
            return
        while all(seqs) and all(s[0]["state"] == "completed" for s in seqs):
            sig = signature(seqs[0][0])
            if any(signature(s[0]) != sig for s in seqs[1:]):
                return
            for r, s in zip(ranks, seqs):
                before = self.prev.get(r)
                self.prev[r] = s.popleft()
                self.seen_sites.add(site_key(self.prev[r]))
                if before is not None:
                    self.seen_pairs.add((site_key(before), site_key(self.prev[r])))
            self.base += 1


def route(ev: dict, groups: dict[str, list[int]]) -> str | None:
    """The channel an event belongs to."""
    if "dir" in ev:
        if ev.get("peer") is None:
            return None  # recv from any source: no partner to align with
        a, b = sorted((ev["rank"], ev["peer"]))
        return f"{ev['g']} p2p {a}<->{b}"
    return ev["g"]


def _cost(x: list, y: list, x_ended: bool, y_ended: bool) -> int:
    c = sum(1 for a, b in zip(x, y) if signature(a) != signature(b))
    if len(x) < len(y) and x_ended or len(y) < len(x) and y_ended:
        c += abs(len(x) - len(y))
    return c


def _matches(x: list, y: list) -> int:
    return sum(1 for p, q in zip(x, y) if signature(p) == signature(q))


def decide_pair(a: list, b: list, i: int, ended_a: str | None, ended_b: str | None, prev_a, prev_b,
                seen: set | None = None, pairs: set | None = None):
    """Two ranks' sequences differ at index i (both present). Returns
    (kind, culprit side 'a'|'b'|'both', ambiguous)."""
    ea, eb = ended_a is not None, ended_b is not None
    options = {
        "both": 1 + _cost(a[i + 1:], b[i + 1:], ea, eb),
        "a": 1 + _cost(a[i + 1:], b[i:], ea, eb),   # a inserted a[i]
        "b": 1 + _cost(a[i:], b[i + 1:], ea, eb),
    }
    best = min(options.values())
    winners = [k for k, v in options.items() if v == best]
    shifts = {"both": (a[i + 1:], b[i + 1:]), "a": (a[i + 1:], b[i:]), "b": (a[i:], b[i + 1:])}
    if len(winners) > 1:
        # Equal cost: the explanation under which more later calls pair up wins (an
        # inserted call that paired silently with the peer's next same-shape call
        # leaves the inserting rank one call ahead; only "it inserted" aligns that call).
        matched = {k: _matches(*shifts[k]) for k in winners}
        most = max(matched.values())
        if most > 0 and list(matched.values()).count(most) == 1:
            side = max(matched, key=matched.get)
            return ("extra" if side != "both" else diff_kind(a[i], b[i])), side, True
    if len(winners) == 1:
        side = winners[0]
        return ("extra" if side != "both" else diff_kind(a[i], b[i])), side, False
    # A tie between "the calls differ" and one insertion: the rest matches either
    # way (a uniform loop), and only the insertion explains the odd call.
    sides = [w for w in winners if w != "both"]
    if len(sides) == 1 and _matches(*shifts[sides[0]]) > 0:
        return "extra", sides[0], True
    # No data decides: the call that repeats the previous one (a loop taking one
    # more turn) is the inserted one if the peer moved on to a call this group
    # made before (the next tick), as in SGLang #30760.
    pa = a[i - 1] if i > 0 else prev_a
    pb = b[i - 1] if i > 0 else prev_b
    rep_a = pa is not None and signature(pa) == signature(a[i])
    rep_b = pb is not None and signature(pb) == signature(b[i])
    known = set(seen or ()) | {site_key(e) for e in a[:i]} | {site_key(e) for e in b[:i]}
    if rep_a and not rep_b and site_key(b[i]) in known:
        return "extra", "a", True
    if rep_b and not rep_a and site_key(a[i]) in known:
        return "extra", "b", True
    # If a inserted a[i], a's next call is b[i]: the group must have made the call
    # at a[i]'s site followed by the one at b[i]'s before. When only one of the two
    # orders was ever seen, that order names the inserting rank (a loop that voted
    # once more, then reached the call its peer is already in).
    seen_pairs = set(pairs or ())
    for seq, p in ((a, pa), (b, pb)):
        chain = ([p] if p is not None and i == 0 else []) + seq[:i]
        seen_pairs.update(zip(map(site_key, chain), map(site_key, chain[1:])))
    a_first = (site_key(a[i]), site_key(b[i])) in seen_pairs
    b_first = (site_key(b[i]), site_key(a[i])) in seen_pairs
    if a_first != b_first:
        return "extra", "a" if a_first else "b", True
    # A block of calls inserted (one more training step while the peer moved on to
    # its checkpoint): the inserting rank's sequence lines up with its peer's again
    # after k calls, and the peer's never does.
    ka, kb = _block(a, b, i), _block(b, a, i)
    if (ka is None) != (kb is None):
        return "extra", "a" if ka is not None else "b", True
    return diff_kind(a[i], b[i]), "both", True


def _block(x: list, y: list, i: int, limit: int = 4096, window: int = 64) -> int | None:
    """Smallest k > 1 such that x[i+k:] agrees with y[i:] on every compared call
    (at least one): x inserted k calls at i."""
    want = [signature(e) for e in y[i:i + window]]
    if not want:
        return None
    for k in range(2, min(len(x) - i, limit)):
        got = x[i + k:i + k + len(want)]
        if got and all(signature(p) == q for p, q in zip(got, want)):
            return k
    return None


def find_divergence(ch: Channel, all_ranks: list[int], ended: dict[int, str | None], now: float,
                    hang_after: float | None, final: bool, settle: float = 0.5,
                    waits: Waits | None = None) -> dict | None:
    """The channel's first divergence as an internal finding, or None (agreeing
    so far, or live data not yet conclusive). waits: which ranks are inside a
    collective elsewhere and which wait in a cycle (see wait_state)."""
    waits = waits or Waits({}, set())
    ranks = [r for r in ch.member_ranks(all_ranks)]
    if len(ranks) < 2:
        return None
    seqs = {r: list(ch.seqs.get(r, ())) for r in ranks}
    stuck = any(r in waits.stuck for r in ranks)  # the data can no longer change
    n = max(len(s) for s in seqs.values())
    for i in range(n):
        at = {r: (s[i] if i < len(s) else None) for r, s in seqs.items()}
        present = {r: e for r, e in at.items() if e is not None}
        sigs = {r: signature(e) for r, e in present.items()}
        if len(present) == len(ranks) and len(set(sigs.values())) == 1:
            continue
        absent = [r for r in ranks if at[r] is None]
        if absent and len(set(sigs.values())) == 1:
            # Some ranks have not (yet) reached this call.
            waiting_long = any(e["state"] == "blocked" and hang_after is not None and now - (e["t"] or now) > hang_after
                               for e in present.values())
            # A wait cycle across groups can never resolve: report it now, not after hang_after.
            if not (final or waiting_long or stuck or all(ended.get(r) for r in absent)):
                return None
            elsewhere = all(waits.busy.get(r, set()) - {ch.key} for r in absent)
            if len(ranks) == 2 and ch.seen_sites and elsewhere and _novel(ch, seqs, i, present):
                # The present rank waits in a call from a place this group never
                # used before, while its peer waits in a collective of another
                # group: that call is the inserted one (an extra call in one group
                # deadlocks another). A peer outside any collective is `missing`.
                return _finding(ch, i, at, "extra", sorted(present), waits)
            if len(absent) < len(present) or not all(ended.get(r) == "clean" for r in absent):
                return _finding(ch, i, at, "missing", absent, waits)
            return _finding(ch, i, at, "extra", sorted(present), waits)
        # Signatures differ: compare each odd rank with a reference of the majority.
        classes: dict = {}
        for r in ranks:
            classes.setdefault(sigs.get(r), []).append(r)
        majority = max(classes.values(), key=lambda rs: (len(rs), -min(rs)))
        if len(ranks) == 2:
            ra, rb = ranks
            if at[ra] is None or at[rb] is None:  # unreachable: handled above
                return None
            kind, side, ambiguous = decide_pair(seqs[ra], seqs[rb], i, ended.get(ra), ended.get(rb),
                                                ch.prev.get(ra), ch.prev.get(rb), ch.seen_sites, ch.seen_pairs)
            if ambiguous and not final and not stuck and now - ch.last_arrival < settle:
                return None  # more events may settle which rank inserted a call (not in a deadlock)
            culprits = {"a": [ra], "b": [rb], "both": [ra, rb]}[side]
            return _finding(ch, i, at, kind, culprits, waits)
        ref = min(majority)
        culprits, kinds = [], []
        for r in ranks:
            if r in majority:
                continue
            culprits.append(r)
            if at[r] is None:
                kinds.append("missing")
            elif at[ref] is None:
                kinds.append("extra")
            else:
                kind, side, _ = decide_pair(seqs[ref], seqs[r], i, ended.get(ref), ended.get(r),
                                            ch.prev.get(ref), ch.prev.get(r), ch.seen_sites, ch.seen_pairs)
                kinds.append("missing" if side == "a" else kind)
        return _finding(ch, i, at, kinds[0], culprits, waits)
    return None


def _novel(ch: Channel, seqs: dict, i: int, present: dict) -> bool:
    seen = set(ch.seen_sites)
    for r, seq in seqs.items():
        seen.update(site_key(e) for e in seq[:i])
    return all(site_key(e) not in seen for e in present.values())


def _finding(ch: Channel, i: int, at: dict, kind: str, culprits: list[int], waits: Waits | None = None) -> dict:
    times = [e["w"] for e in at.values() if e is not None and e.get("w") is not None]
    out = {"channel": ch.key, "seq": ch.base + i, "kind": kind, "culprits": sorted(culprits),
           "events": at, "time": min(times) if times else 0.0}
    if waits is not None and waits.cycle and any(r in waits.stuck for r in at):
        out["deadlock"] = waits.cycle
    return out
