"""Channels of calls that must agree, the evidence that they do not, and the finding.

A channel is what must agree: a process group's collectives (members = its rank set), the
labelled events of assert_same ("labels", all ranks), the group creations ("groups", all
ranks: new_group must be called by every rank in one order), or the p2p traffic in one
direction between two ranks of a group (the k-th send from a to b meets b's k-th receive
from a: crossing sends in one batch are legal). Each rank's channel sequence is a list; the
agreed-and-completed prefix is dropped as it goes (live mode keeps memory bounded) and
`base` counts what was dropped, so seq = base + index.

Only evidence makes a divergence (docs/consensus.md "Evidence, cause and culprit"): calls the
transport paired that differ in op, shapes, dtypes, reduce op, root or label; a rank absent
from a call its peers made, once that is conclusive; a wait cycle. The cause is then found by
aligning the ranks' sequences (blame.py): the first call with no counterpart, however far
before the evidence, and the rank whose path deviated.
"""

from __future__ import annotations

import json
from collections import deque

from hctool.consensus import blame
from hctool.consensus.pattern import HOLD, ROOTED, Pattern, Scan, hard_signature, pattern_key, site_key
from hctool.consensus.structure import SourceMap
from hctool.consensus.waits import Waits

__all__ = ["ROOTED", "Channel", "diff_kind", "pair_label", "find_divergence", "route", "signature", "site_key"]

diff_kind = blame.diff_kind


def signature(ev: dict) -> tuple:
    """The hard signature and the call site (what the report shows as one call)."""
    if "dir" in ev:
        return hard_signature(ev)
    return hard_signature(ev) + (site_key(ev),)


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
        self.prev: dict[int, dict] = {}  # last dropped event per rank (the context of the window's first call)
        self.seen_sites: set = set()  # call sites of the agreed prefix (bounded by the program's sites)
        self.history = blame.History()  # what the dropped prefix did, per place (the pattern blame reads)
        self.pattern = Pattern()  # cross-site pairings of the dropped prefix
        self.window_pairings: dict = {}  # cross-site pairings the last look at the window saw
        self.agreed = 0  # leading window positions known to agree (prune's look-ahead)

    def add(self, ev: dict, now: float) -> None:
        self.seqs.setdefault(ev["rank"], deque()).append(ev)
        self.last_arrival = now

    def member_ranks(self, all_ranks: list[int]) -> list[int]:
        return self.members if self.members is not None else all_ranks

    def prune(self, all_ranks: list[int], ahead_agreed: bool = False) -> None:
        """Drop the prefix on which every member made an equal call and completed it.
        A cross-site pairing stays until HOLD more calls follow it (a later divergence may
        be located there). ahead_agreed: the caller knows HOLD agreed calls follow the window
        (the column blocks behind it)."""
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
            if what[0] == "cross" and not ahead_agreed and not self._agreed_ahead(seqs, HOLD):
                return  # kept until HOLD agreed calls follow it: a divergence within them is located here
            scan.step(self.base, events, what)
            for r, s in zip(ranks, seqs):
                ev = s.popleft()
                self._learn(r, self.prev.get(r), ev)
                self.prev[r] = ev
            self.base += 1
            self.agreed = max(0, self.agreed - 1)

    def _agreed_ahead(self, seqs: list, n: int) -> bool:
        """Whether the n calls after each sequence's first are there and agree (equal and
        completed). The run already known to agree is kept (self.agreed: leading positions), so
        a long stretch of cross-site pairings is checked once, not n times per call."""
        if min(map(len, seqs)) <= n:
            return False
        k = max(1, self.agreed)
        while k <= n:
            sig = hard_signature(seqs[0][k])
            if any(s[k]["state"] != "completed" or hard_signature(s[k]) != sig for s in seqs):
                return False
            k += 1
            self.agreed = k
        return True

    def _learn(self, rank: int, before: dict | None, ev: dict) -> None:
        self.seen_sites.add(site_key(ev))
        self.history.learn(rank, ev)


def route(ev: dict, groups: dict[str, list[int]]) -> str | None:
    """The channel an event belongs to."""
    if "dir" in ev:
        if ev.get("peer") is None:
            return None  # recv from any source: no partner to align with
        src, dst = (ev["rank"], ev["peer"]) if ev["dir"] == "send" else (ev["peer"], ev["rank"])
        return f"{ev['g']} p2p {src}->{dst}"
    return ev["g"]


def find_divergence(
    ch: Channel,
    all_ranks: list[int],
    ended: dict[int, str | None],
    now: float,
    hang_after: float | None,
    final: bool,
    settle: float = 0.5,
    waits: Waits | None = None,
    sources: SourceMap | None = None,
    traced: set[int] | None = None,
) -> dict | None:
    """The channel's first divergence as an internal finding, or None (agreeing so far, or live
    data not yet conclusive). Evidence first (a mismatch the transport paired, an absence that is
    conclusive), then the cause: the alignment of the ranks' sequences (blame.py).
    waits: which ranks are inside a collective elsewhere and which wait in a cycle."""
    look = _Look(
        ch,
        list(ch.member_ranks(all_ranks)),
        ended,
        now,
        hang_after,
        final,
        settle,
        waits or Waits({}, set()),
        sources or SourceMap(),
        traced,
    )
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
            scan.step(ch.base + i, at)  # cross-site pairings: where a later divergence may be located, not evidence
            continue
        f = look.absent(i, at, present) if equal else look.mismatch(i, at)
        if f is not None:
            # when the evidence was there: what detection latency is measured from (the cause may be far earlier)
            times = [e["w"] for e in present.values() if e.get("w") is not None]
            f["evidence_time"] = max(times) if times else f["time"]
        return f
    return None


class _Look:
    """One look at a channel's window (the arguments of find_divergence)."""

    def __init__(
        self,
        ch: Channel,
        ranks: list[int],
        ended: dict,
        now: float,
        hang_after: float | None,
        final: bool,
        settle: float,
        waits: Waits,
        sources: SourceMap,
        traced: set[int] | None = None,
    ):
        self.ch, self.ranks, self.ended, self.now, self.hang_after = ch, ranks, ended, now, hang_after
        self.final, self.settle, self.waits, self.sources, self.traced = final, settle, waits, sources, traced
        self.seqs = {r: list(ch.seqs.get(r, ())) for r in ranks}
        self.stuck = any(r in waits.stuck for r in ranks)  # the data can no longer change

    def closed(self, r: int) -> bool:
        """Rank r makes no more calls in this channel: it ended, waits in a cycle, or the analysis is final."""
        return self.final or self.ended.get(r) is not None or r in self.waits.stuck or r in self.waits.held

    def absent(self, i: int, at: dict, present: dict) -> dict | None:
        """Some members have not (yet) made the call the others made at i."""
        ch, ended, waits = self.ch, self.ended, self.waits
        absent = [r for r in self.ranks if at[r] is None]
        waiting_long = any(
            e["state"] == "blocked"
            and self.hang_after is not None
            and self.now - (e["t"] or self.now) > self.hang_after
            for e in present.values()
        )
        # A wait cycle across groups can never resolve: report it now, not after hang_after.
        if not (self.final or waiting_long or self.stuck or all(ended.get(r) for r in absent)):
            return None
        untraced = [r for r in absent if self.traced is not None and r not in self.traced and ended.get(r) is None]
        if (
            untraced
            and not (self.final or self.stuck)
            and not any(
                e["state"] == "blocked" and self.now - (e["t"] or self.now) > 3 * (self.hang_after or 0)
                for e in present.values()
            )
        ):
            return None  # no trace yet (still importing torch, joining the group): late, not absent
        earlier = self.explain(i)
        if earlier is not None and earlier["seq"] < ch.base + i and earlier.get("cause_seq", ch.base + i) < ch.base + i:
            return earlier  # an unmatched call before the absence explains it (an inserted call that paired silently)
        dead = [r for r in absent if ended.get(r) not in (None, "clean")]
        if dead and len(absent) <= len(present):
            return self.finding(
                i,
                at,
                "missing",
                dead,
                cause=(min(present), i),
                confidence="high",
                waiting_on=True,
                basis=f"rank(s) {_ranks(dead)} ended ({ended[dead[0]]}) without making the call "
                f"rank(s) {_ranks(sorted(present))} made",
            )
        elsewhere = all(waits.busy.get(r, set()) - {ch.key} for r in absent)
        if (
            len(self.ranks) == 2
            and ch.seen_sites
            and elsewhere
            and not self.stuck
            and _novel(ch, self.seqs, i, present)
        ):
            # The present rank waits in a call from a place this group never used before, while
            # its peer waits in a collective of another group: that call is the inserted one (an
            # extra call in one group deadlocks another). A peer outside any collective is `missing`.
            # (When the two wait for each other, a cycle, analyze.py weighs both waiting calls.)
            (r,) = present
            return self.finding(
                i,
                at,
                "extra",
                [r],
                cause=(r, i),
                confidence="high",
                basis=f"rank {r} waits in a call from a place this group never used, while its peer "
                f"waits in another group",
            )
        if all(r in waits.stuck for r in absent):
            # Nobody is short: the absent ranks wait in another group for these (analyze.py names the cycle).
            return self.finding(
                i,
                at,
                "wait_cycle",
                sorted(waits.stuck),
                cause=(min(present), i),
                confidence="high",
                basis="the ranks wait for each other across groups",
            )
        still_here = [r for r in absent if ended.get(r) is None]
        if still_here and not self.stuck and len(self.ranks) == 2:
            # alive, outside any collective of this group, while its peer waits: missing (its stack says where)
            if not (waits.busy.get(still_here[0], set()) - {ch.key}):
                return self.finding(
                    i,
                    at,
                    "missing",
                    still_here,
                    cause=(min(present), i),
                    confidence="high",
                    waiting_on=True,
                    basis=f"rank {still_here[0]} is alive but not in any collective while rank "
                    f"{min(present)} waits for it",
                )
        return self.explain(i)

    def mismatch(self, i: int, at: dict) -> dict | None:
        return self.explain(i)

    def explain(self, i: int) -> dict | None:
        """The cause of the evidence at window index i: align, then blame."""
        ranks, seqs = self.ranks, self.seqs
        if len(ranks) == 2:
            ra, rb = ranks
            off = max(0, i - blame.MAX_ALIGN * 3 // 4)  # bounded work: the calls around the evidence
            a, b = seqs[ra][off : i + blame.MAX_ALIGN // 4], seqs[rb][off : i + blame.MAX_ALIGN // 4]
            closed_a = self.closed(ra) or (_stopped(a) and len(a) == len(seqs[ra]) - off)
            closed_b = self.closed(rb) or (_stopped(b) and len(b) == len(seqs[rb]) - off)
            ops = blame.align(a, b, closed_a, closed_b)
            prev_a = seqs[ra][off - 1] if off else self.ch.prev.get(ra)
            prev_b = seqs[rb][off - 1] if off else self.ch.prev.get(rb)
            view = blame.PairView(ra, rb, a, b, prev_a, prev_b, self.ended, self.ch.history, self.sources)
            v = blame.explain_pair(view, ops, self.stuck)
            if v is None:
                return None
            if (
                v.confidence == "low"
                and not self.final
                and not self.stuck
                and self.now - self.ch.last_arrival < self.settle
            ):
                return None  # more events may settle which rank deviated (not in a deadlock)
            rare = self.rare_pairing(v, a if v.cause_rank == ra else b, v.cause_index)
            return rare if rare is not None else self.verdict(v, off)
        return self.majority(i)

    def rare_pairing(self, v: blame.Verdict, seq: list, ci: int) -> dict | None:
        """An extra call that paired silently long before the evidence has left the window, but
        not the channel's pattern: a cross-site pairing seen once, whose call on the rank with
        the surplus came from a place that rank used once and its peer never. When the window's
        own cause is a call from a place both ranks use every turn, that pairing is the cause."""
        if v.kind != "extra" or len(v.culprits) != 1 or not (0 <= ci < len(seq)):
            return None
        (culprit,) = v.culprits
        here = pattern_key(seq[ci])
        others = [r for r in self.ranks if r != culprit]
        h = self.ch.history
        if h.calls(culprit, here) <= 1:
            return None  # the window's cause is itself a place of its own: it stands
        pos = self.ranks.index(culprit)
        for combo, p in sorted(self.ch.pattern.pairings.items(), key=lambda kv: kv[1]["seq"]):
            key = combo[pos] if pos < len(combo) else None
            if p["count"] != 1 or key is None:
                continue
            if h.calls(culprit, key) == 1 and all(h.calls(r, key) == 0 for r in others):
                ev = p["events"].get(culprit)
                if ev is None:
                    continue
                out = _finding(self.ch, 0, p["events"], "extra", [culprit], self.waits)
                out.update(
                    seq=p["seq"],
                    cause_rank=culprit,
                    cause_seq=p["seq"],
                    cause_event=ev,
                    confidence="medium",
                    basis=f"rank {culprit} made one call from {ev.get('site')} that no other rank ever made, "
                    f"{self.ch.base + ci - p['seq']} calls before the evidence; it paired silently with "
                    f"rank {others[0]}'s call at {p['events'][others[0]].get('site')}, and rank {culprit} "
                    f"has been one call ahead since",
                    alternative=v.basis,
                    after=None,
                    waiting_on=False,
                    time=ev.get("w") or 0.0,
                )
                return out
        return None

    def majority(self, i: int) -> dict:
        """Three or more ranks: the odd ones out by majority at the evidence; each culprit's cause
        found by aligning it with a rank of the majority."""
        at = {r: (s[i] if i < len(s) else None) for r, s in self.seqs.items()}
        sigs = {r: (hard_signature(e) if e is not None else None) for r, e in at.items()}
        classes: dict = {}
        for r in self.ranks:
            classes.setdefault(sigs[r], []).append(r)
        majority = max(classes.values(), key=lambda rs: (len(rs), sigs[rs[0]] is not None, -min(rs)))
        ref = min(majority)
        culprits = [r for r in self.ranks if r not in majority]
        strict = len(majority) * 2 > len(self.ranks)
        best = None
        for r in culprits:
            a, b = self.seqs[r], self.seqs[ref]
            ops = blame.align(a, b, self.closed(r) or _stopped(a), self.closed(ref) or _stopped(b))
            view = blame.PairView(
                r, ref, a, b, self.ch.prev.get(r), self.ch.prev.get(ref), self.ended, self.ch.history, self.sources
            )
            got = blame.explain_against(view, ops)
            if got is None:
                continue
            kind, side, ci = got
            cause = (r, ci) if side == 0 else (ref, ci)
            if best is None or ci < best[2]:
                best = (cause, kind, ci)
        if best is None:
            kind = "missing" if at[culprits[0]] is None else diff_kind(at[culprits[0]], at[ref]) if at[ref] else "extra"
            best = ((culprits[0], i), kind, i)
        cause, kind, idx = best
        if kind == "extra" and culprits == [cause[0]]:
            # the odd rank's surplus call here may be the tail of a silent shift that began with a
            # pairing long gone from the window: the same test as for two ranks
            v = blame.Verdict(
                "extra",
                culprits,
                cause[0],
                cause[1],
                idx,
                "high",
                f"{len(majority)} of {len(self.ranks)} ranks agree; rank {cause[0]} made a call the others did not",
            )
            rare = self.rare_pairing(v, self.seqs[cause[0]], cause[1])
            if rare is not None:
                return rare
        what = {"extra": "made a call the others did not", "missing": "lacks a call the others made"}.get(
            kind, f"differs in {kind.replace('_', ' ')}"
        )
        return self.finding(
            idx,
            {r: (s[idx] if idx < len(s) else None) for r, s in self.seqs.items()},
            kind,
            culprits,
            cause=cause,
            confidence="high" if strict else "medium",
            basis=f"{len(majority)} of {len(self.ranks)} ranks agree; rank(s) {_ranks(culprits)} {what}",
        )

    def verdict(self, v: blame.Verdict, off: int) -> dict:
        idx = v.index + off
        at = {r: (s[idx] if idx < len(s) else None) for r, s in self.seqs.items()}
        return self.finding(
            idx,
            at,
            v.kind,
            v.culprits,
            cause=(v.cause_rank, v.cause_index + off),
            confidence=v.confidence,
            basis=v.basis,
            alternative=v.alternative,
        )

    def finding(
        self,
        i: int,
        at: dict,
        kind: str,
        culprits: list[int],
        cause: tuple[int, int],
        confidence: str,
        basis: str,
        alternative: str | None = None,
        waiting_on: bool = False,
    ) -> dict:
        r, ci = cause
        seq = self.seqs.get(r, [])
        cause_ev = seq[ci] if 0 <= ci < len(seq) else None
        out = _finding(self.ch, i, at, kind, culprits, self.waits)
        out.update(
            cause_rank=r,
            cause_seq=self.ch.base + ci,
            cause_event=cause_ev,
            confidence=confidence,
            basis=basis,
            alternative=alternative,
            after=_after(self.ch, r, seq, ci),
            waiting_on=waiting_on,
        )
        if cause_ev is not None and cause_ev.get("w") is not None:
            out["time"] = cause_ev["w"]
        return out


def _after(ch: Channel, rank: int, seq: list, ci: int) -> dict | None:
    """The run of equal calls right before the cause on its rank ("after 7 calls of all_reduce at
    t.py:8": the turn of the loop it came in)."""
    prev = seq[ci - 1] if 0 < ci <= len(seq) else ch.prev.get(rank)
    if prev is None:
        return None
    key, n = pattern_key(prev), 0
    while n < ci and pattern_key(seq[ci - 1 - n]) == key:
        n += 1
    if n == ci:
        cur = ch.history.current.get(rank)
        n += cur[1] if cur is not None and cur[0] == key else (1 if ci == 0 else 0)
    return {"op": prev.get("op"), "site": prev.get("site"), "count": n}


def _ranks(rs) -> str:
    return ", ".join(map(str, rs))


def _stopped(seq: list) -> bool:
    """The sequence ends in a call that never returned or that failed: its thread makes no more."""
    return bool(seq) and seq[-1]["state"] in ("blocked", "failed") and not seq[-1].get("async")


def _novel(ch: Channel, seqs: dict, i: int, present: dict) -> bool:
    seen = set(ch.seen_sites)
    for _r, seq in seqs.items():
        seen.update(site_key(e) for e in seq[:i])
    return all(site_key(e) not in seen for e in present.values())


def _finding(ch: Channel, i: int, at: dict, kind: str, culprits: list[int], waits: Waits | None = None) -> dict:
    times = [e["w"] for e in at.values() if e is not None and e.get("w") is not None]
    out = {
        "channel": ch.key,
        "seq": ch.base + i,
        "kind": kind,
        "culprits": sorted(culprits),
        "events": at,
        "time": min(times) if times else 0.0,
    }
    if waits is not None and waits.cycle and any(r in waits.stuck for r in at):
        out["deadlock"] = waits.cycle
        out["cycle"] = list(waits.calls)
    return out
