"""Aligning the per-rank sequences of each group and naming the first divergence.

A channel is what must agree: a process group's collectives (members = its
rank set), the labelled events of assert_same ("labels", all ranks), or the
p2p traffic between two ranks of a group. Each rank's channel sequence is a
list; the agreed-and-completed prefix is dropped as it goes (live mode keeps
memory bounded) and `base` counts what was dropped, so seq = base + index.
Only evidence makes a divergence; calls paired across call sites locate it
(pattern.py, locate.py). At the evidence, the cost of three explanations is
compared over the rest of the sequences (a small diff): rank A inserted a
call, rank B inserted one, or the two calls differ.
"""

from __future__ import annotations

import json
from collections import deque

from hctool.consensus import locate
from hctool.consensus.pattern import HARD_FIELDS, HOLD, ROOTED, Pattern, Scan, field, hard_signature, site_key
from hctool.consensus.waits import Waits

__all__ = ["ROOTED", "Channel", "decide_pair", "diff_kind", "pair_label", "find_divergence", "route", "signature", "site_key"]


def signature(ev: dict) -> tuple:
    """What the aligner compares to explain a divergence: the hard signature and the call site."""
    if "dir" in ev:
        return hard_signature(ev)
    return hard_signature(ev) + (site_key(ev),)


def diff_kind(a: dict, b: dict) -> str:
    if "dir" in a or "dir" in b:
        sa, sb = signature(a), signature(b)
        if sa[:2] != sb[:2]:
            return "op"
        return "shape" if sa[2] != sb[2] else "dtype"
    for f, kind in HARD_FIELDS:
        if field(a, f) != field(b, f):
            return kind
    return "site"


def pair_label(a: dict, b: dict) -> tuple[bool, str]:
    """(agree, words) for two calls that met at one sequence number, as the report and the export
    draw them: a call-site difference alone is a pairing, not a mismatch (docs/consensus.md)."""
    if hard_signature(a) != hard_signature(b):
        return False, f"paired, mismatched: {diff_kind(a, b)}"
    return True, "paired" if signature(a) == signature(b) else "paired across call sites"


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
        self.pattern = Pattern()          # cross-site pairings and per-site meetings of the dropped prefix
        self.runs: dict[int, tuple] = {}  # rank -> (signature, how many in a row) at the end of the dropped prefix
        self.window_pairings: dict = {}   # cross-site pairings the last look at the window saw

    def add(self, ev: dict, now: float) -> None:
        self.seqs.setdefault(ev["rank"], deque()).append(ev)
        self.last_arrival = now

    def member_ranks(self, all_ranks: list[int]) -> list[int]:
        return self.members if self.members is not None else all_ranks

    def prune(self, all_ranks: list[int]) -> None:
        """Drop the prefix on which every member made an equal call and completed it.
        A cross-site pairing stays until HOLD more calls follow it (a later divergence may
        be located there)."""
        ranks = self.member_ranks(all_ranks)
        seqs = [self.seqs.get(r) for r in ranks]
        if len(ranks) < 2 or any(not s for s in seqs):
            return
        scan = Scan(self.pattern, ranks, commit=True)
        while all(seqs) and all(s[0]["state"] == "completed" for s in seqs):
            sig = hard_signature(seqs[0][0])
            if any(hard_signature(s[0]) != sig for s in seqs[1:]):
                return
            events = {r: s[0] for r, s in zip(ranks, seqs)}
            what = scan.classify(events)
            if what[0] == "cross" and min(map(len, seqs)) <= HOLD:
                return
            scan.step(self.base, events, what)
            for r, s in zip(ranks, seqs):
                before = self.prev.get(r)
                self.prev[r] = s.popleft()
                sig_r = signature(self.prev[r])
                run = self.runs.get(r)
                self.runs[r] = (sig_r, run[1] + 1 if run and run[0] == sig_r else 1)
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
                seen: set | None = None, pairs: set | None = None, runs: tuple[int, int] = (0, 0)):
    """Two ranks' sequences differ at index i (both present). Returns
    (kind, culprit side 'a'|'b'|'both', ambiguous). runs: how many calls equal to
    a[i] (b[i]) each rank made in a row right before it."""
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
    # Last: both calls still wait (the backend did not meet them as one call and
    # fail), and one rank's call repeats its previous one while the other's is new:
    # a loop that took one more turn (DDP: one batch more on one rank while its peer
    # waits in the barrier after its loop). Calls that met and failed are both named.
    waiting = a[i]["state"] == b[i]["state"] == "blocked" and not ea and not eb
    turning_a, turning_b = runs[0] >= 2, runs[1] >= 2  # the loop was seen turning, not one call made twice
    if waiting and turning_a != turning_b and not (rep_a if turning_b else rep_b):
        return "extra", "a" if turning_a else "b", True
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
    so far, or live data not yet conclusive). Only evidence makes a divergence
    (docs/consensus.md "Evidence and location"): calls that differ in op, shapes,
    dtypes, reduce op, root or label; a rank absent from a call its peers made,
    once that is conclusive (a count that differs at the end, a rank blocked
    while its peers are gone or waiting in a cycle). A pairing of equal calls from
    different call sites, even one that shifts how often each line meets (a joined
    rank's shadow all-reduces, a neutral vote from another line), is only
    where such a divergence is located. waits: which ranks are inside a
    collective elsewhere and which wait in a cycle (see wait_state)."""
    look = _Look(ch, list(ch.member_ranks(all_ranks)), ended, now, hang_after, final, settle, waits or Waits({}, set()))
    if len(look.ranks) < 2:
        return None
    seqs = look.seqs
    scan = Scan(ch.pattern, look.ranks)
    ch.window_pairings = scan.pairings
    for i in range(max(len(s) for s in seqs.values())):
        at = {r: (s[i] if i < len(s) else None) for r, s in seqs.items()}
        present = {r: e for r, e in at.items() if e is not None}
        equal = len({hard_signature(e) for e in present.values()}) == 1
        if equal and len(present) == len(look.ranks):
            scan.step(ch.base + i, at)  # cross-site pairings: where a later divergence is located, not evidence
            continue
        if equal:
            return look.absent(i, at, present)
        return look.mismatch(i, at)
    return None


class _Look:
    """One look at a channel's window (the arguments of find_divergence)."""

    def __init__(self, ch: Channel, ranks: list[int], ended: dict, now: float, hang_after: float | None,
                 final: bool, settle: float, waits: Waits):
        self.ch, self.ranks, self.ended, self.now, self.hang_after = ch, ranks, ended, now, hang_after
        self.final, self.settle, self.waits = final, settle, waits
        self.seqs = {r: list(ch.seqs.get(r, ())) for r in ranks}
        self.stuck = any(r in waits.stuck for r in ranks)  # the data can no longer change

    def run_before(self, r: int, i: int) -> int:
        """How many calls equal to rank r's call at i it made in a row right before."""
        seq, sig, n = self.seqs[r], signature(self.seqs[r][i]), 0
        while n < i and signature(seq[i - 1 - n]) == sig:
            n += 1
        run = self.ch.runs.get(r)
        return n + run[1] if n == i and run and run[0] == sig else n

    def finding(self, i: int, kind: str, culprits: list[int]) -> dict:
        at = {r: (s[i] if i < len(s) else None) for r, s in self.seqs.items()}
        return _finding(self.ch, i, at, kind, culprits, self.waits)

    def absent(self, i: int, at: dict, present: dict) -> dict | None:
        """Some members have not (yet) made the call the others made at i."""
        ch, ended, waits = self.ch, self.ended, self.waits
        absent = [r for r in self.ranks if at[r] is None]
        waiting_long = any(e["state"] == "blocked" and self.hang_after is not None
                           and self.now - (e["t"] or self.now) > self.hang_after for e in present.values())
        # A wait cycle across groups can never resolve: report it now, not after hang_after.
        if not (self.final or waiting_long or self.stuck or all(ended.get(r) for r in absent)):
            return None
        if len(present) <= len(absent):
            # Evidence that the present ranks made a call more: did one of them insert it
            # earlier, where it paired with a peer's call from another line?
            p = locate.inserted_at(self.seqs[min(present)], self.seqs[min(absent)], i, True, True)
            if p is not None:
                return self.finding(p, "extra", sorted(present))
        elsewhere = all(waits.busy.get(r, set()) - {ch.key} for r in absent)
        if len(self.ranks) == 2 and ch.seen_sites and elsewhere and _novel(ch, self.seqs, i, present):
            # The present rank waits in a call from a place this group never
            # used before, while its peer waits in a collective of another
            # group: that call is the inserted one (an extra call in one group
            # deadlocks another). A peer outside any collective is `missing`.
            return _finding(ch, i, at, "extra", sorted(present), waits)
        if all(r in waits.stuck for r in absent):
            # Nobody is short: the absent ranks wait in another group for these (analyze.py names the cycle).
            return _finding(ch, i, at, "wait_cycle", sorted(waits.stuck), waits)
        if len(absent) < len(present) or not all(ended.get(r) == "clean" for r in absent):
            return _finding(ch, i, at, "missing", absent, waits)
        return _finding(ch, i, at, "extra", sorted(present), waits)

    def mismatch(self, i: int, at: dict, located: bool = False) -> dict | None:
        """The members' calls at i differ (or, located, pair across call sites):
        compare each odd rank with a reference of the majority."""
        ch, ranks, seqs, ended = self.ch, self.ranks, self.seqs, self.ended
        sigs = {r: hard_signature(e) for r, e in at.items() if e is not None}  # a site alone divides no majority
        classes: dict = {}
        for r in ranks:
            classes.setdefault(sigs.get(r), []).append(r)
        majority = max(classes.values(), key=lambda rs: (len(rs), -min(rs)))
        if len(ranks) == 2:
            ra, rb = ranks
            if not located:  # an earlier cross-site pairing where one rank inserted the call that now differs
                for x, y in ((ra, rb), (rb, ra)):
                    p = locate.inserted_at(seqs[x], seqs[y], i, True, True)
                    if p is not None:
                        return self.finding(p, "extra", [x])
            kind, side, ambiguous = decide_pair(seqs[ra], seqs[rb], i, ended.get(ra), ended.get(rb),
                                                ch.prev.get(ra), ch.prev.get(rb), ch.seen_sites, ch.seen_pairs,
                                                (self.run_before(ra, i), self.run_before(rb, i)))
            if ambiguous and not self.final and not self.stuck and self.now - ch.last_arrival < self.settle:
                return None  # more events may settle which rank inserted a call (not in a deadlock)
            culprits = {"a": [ra], "b": [rb], "both": [ra, rb]}[side]
            return _finding(ch, i, at, kind, culprits, self.waits)
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
        return _finding(ch, i, at, kinds[0], culprits, self.waits)


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
        out["cycle"] = list(waits.calls)
    return out
