"""From traces to the check-consensus report (docs/contracts.md)."""

from __future__ import annotations

import os
import time

from hctool.consensus import blame, probes, truncation
from hctool.consensus.align import Channel, channel_members, find_divergence, route
from hctool.consensus.classes import ranges
from hctool.consensus.flight_recorder import is_flight_recorder_dir
from hctool.consensus.model import (
    Call,
    Cause,
    Confidence,
    Coverage,
    Divergence,
    Kind,
    RankCall,
    Report,
    Symptom,
    Verdict,
)
from hctool.consensus.pattern import HOLD, caller_text, pairings_of, pattern_key, site_key
from hctool.consensus.structure import SourceMap
from hctool.consensus.trace import TraceDirReader, TraceError, trace_files
from hctool.consensus.waits import wait_state

GROUPS = "groups"  # the pseudo-group of new_group calls (every rank, one order)
MAX_MISSING_RANKS = 1024  # ranks a header may claim beyond the trace files present
MAX_PENDING = 1_000_000  # unagreed events held before the analysis stops reading


class Tracker:
    """Channels fed from events; shared by the offline analyzer and LiveWatcher."""

    def __init__(self) -> None:
        self.channels: dict[str, Channel] = {}
        self.groups: dict[str, list[int]] = {}
        self.ranks: set[int] = set()
        self.world_size: int | None = None
        self.last_event: dict[int, dict] = {}
        self.thread_last: dict[tuple, dict] = {}  # (rank, thread) -> latest event (align.wait_state)
        self.counts: dict[int, dict[str, int]] = {}  # rank -> op -> calls seen (evidence of what was checked)
        self.last_blocking: dict[int, dict] = {}  # rank -> its latest call that has not (yet) completed
        self.sources = SourceMap()  # the program's source, for its structure (blame.py)
        self.traced: set[int] | None = None  # ranks with a trace file (None: not known, FR dumps)
        self.capped: set[tuple] = set()  # (rank, channel) whose later calls were only counted

    def add(self, ev: dict, now: float) -> None:
        per_op = self.counts.setdefault(ev["rank"], {})
        if ev["g"] != GROUPS:  # group creations are compared, not counted as calls
            per_op[ev["op"]] = per_op.get(ev["op"], 0) + 1
        key = route(ev, self.groups)
        if key is None:
            return
        ch = self.channels.get(key)
        if ch is None:
            members = None if ev["g"] in ("labels", GROUPS) else channel_members(key, self.groups)
            if " p2p " in key:
                members = sorted({ev["rank"], ev["peer"]})
            ch = self.channels[key] = Channel(key, members)
        ch.add(ev, now)
        self.ranks.add(ev["rank"])
        self._note(ev)

    def _note(self, ev: dict) -> None:
        # latest by entry time: a poll hands a file's side-table events (labels, group creations)
        # before its ring's calls, whatever their order in time
        last = self.last_event.get(ev["rank"])
        if last is None or (ev.get("t") or 0.0) >= (last.get("t") or 0.0):
            self.last_event[ev["rank"]] = ev
        tkey = (ev["rank"], ev.get("th"))
        last = self.thread_last.get(tkey)
        if last is None or (ev.get("t") or 0.0) >= (last.get("t") or 0.0):
            self.thread_last[tkey] = ev

    def add_blocks(self, blocks: list, interner, now: float, final: bool = False) -> None:
        """Column blocks (consensus/columns.py) of completed calls, each preceding any other call of
        its channel in this poll: the prefix every member of a channel made alike is folded into its
        history at once; the rest becomes events, in order, for the ordinary path. final (nothing
        more will come: a folder of dumps): the evidence lies within HOLD calls of where the fold
        stopped, so a channel's calls beyond that and the alignment's reach are only counted."""
        from hctool.consensus.columns import agreed_prefix, concat

        by_channel: dict[str, dict[int, list]] = {}
        for rank, key, block in blocks:
            by_channel.setdefault(key, {}).setdefault(rank, []).append(block)
        for key, per_rank in by_channel.items():
            ch = self.channels.get(key)
            if ch is None:
                ch = self.channels[key] = Channel(key, channel_members(key, self.groups))
            got = {r: concat(bs) for r, bs in per_rank.items()}
            used = {r: 0 for r in got}
            members = ch.member_ranks(self.all_ranks())
            # Events left in the window from earlier polls (a rank ahead by a few calls) come first:
            # bring the others level with events, let the ordinary prune drain the window, then fold.
            if len(members) >= 2 and any(ch.seqs.get(r) for r in members):
                need = max(len(ch.seqs.get(r, ())) for r in members)
                for r in members:
                    if r in got:
                        k = min(max(0, need - len(ch.seqs.get(r, ()))), len(got[r]))
                        for i in range(k):
                            self.add(got[r].make(i), now)
                        used[r] = k
                ch.prune(self.all_ranks())
            rest = {r: got[r].tail(used[r]) for r in got}
            if (
                len(members) >= 2
                and set(rest) >= set(members)
                and any(ch.seqs.get(r) for r in members)
                and len({len(ch.seqs.get(r, ())) for r in members}) == 1
                and agreed_prefix([rest[r] for r in members], 0)[0] >= HOLD
            ):
                # the window is level and waits only on its look-ahead (a stretch of cross-site
                # pairings: a rank one call ahead since a silent extra call), which the blocks give
                ch.prune(self.all_ranks(), ahead_agreed=True)
            b = 0
            if len(members) >= 2 and set(rest) >= set(members) and all(not ch.seqs.get(r) for r in members):
                b, cross = agreed_prefix([rest[r] for r in members], HOLD)
                if len(cross):
                    self._commit_pairings(ch, members, {r: rest[r] for r in members}, cross, interner)
            if b:
                self._fold(ch, {r: rest[r] for r in members}, b, interner, now)
            cap = b + HOLD + blame.MAX_ALIGN if final else None
            for r, block in rest.items():
                first = b if r in members else 0
                end = len(block) if cap is None else min(len(block), cap)
                for i in range(first, end):
                    self.add(block.make(i), now)
                if end < len(block):  # counted, not kept; its last call is where the rank was
                    self._count(r, block.op[end:], interner)
                    self._note(block.make(len(block) - 1))
                    self.capped.add((r, key))

    def _count(self, rank: int, ops, interner) -> None:
        import numpy as np

        per_op = self.counts.setdefault(rank, {})
        got, n = np.unique(ops, return_counts=True)
        for o, c in zip(got.tolist(), n.tolist()):
            name = interner.op_names[o]
            per_op[name] = per_op.get(name, 0) + c

    def _commit_pairings(self, ch: Channel, members: list[int], blocks: dict, cross, interner) -> None:
        """Cross-site pairings in a folded prefix go into the channel's pattern, as prune() commits them."""

        from hctool.consensus.columns import unique_rows
        from hctool.consensus.pattern import MAX_PAIRINGS

        combos, first, counts = unique_rows([blocks[r].key[cross] for r in members], counts=True, index=True)
        for combo, i, c in zip(combos.tolist(), first.tolist(), counts.tolist()):
            key = tuple(interner.key_obj[k] for k in combo)
            mine = ch.pattern.pairings.get(key)
            if mine is not None:
                mine["count"] += c
            elif len(ch.pattern.pairings) < MAX_PAIRINGS:
                pos = int(cross[i])
                ch.pattern.pairings[key] = {
                    "seq": ch.base + pos,
                    "count": c,
                    "events": {r: blocks[r].make(pos) for r in members},
                }

    def _fold(self, ch: Channel, blocks: dict, b: int, interner, now: float) -> None:
        """The first b calls of every member's block agree: into the channel's history, not its window."""
        import numpy as np

        for r, block in blocks.items():
            keys, hards = block.key[:b], block.hard[:b]
            ch.history.learn_block(r, keys, hards, interner.key_obj, interner.hard_obj)
            ch.seen_sites.update(interner.site_obj[k] for k in np.unique(keys).tolist())
            self._count(r, block.op[:b], interner)
            # the latest call of each thread, and the last call, as the event the rest of the analysis keeps
            th = block.th[:b]
            lasts = sorted({int(np.flatnonzero(th == t)[-1]) for t in np.unique(th).tolist()})
            for i in lasts:
                ev = block.make(i)
                self._note(ev)
                if i == b - 1:
                    ch.prev[r] = ev
            self.ranks.add(r)
        ch.base += b
        ch.agreed = 0  # the window's positions moved under prune's look-ahead
        ch.last_arrival = now

    def all_ranks(self) -> list[int]:
        n = self.world_size or 0
        return sorted(self.ranks | set(range(n)))

    def pending(self) -> int:
        return sum(len(s) for ch in self.channels.values() for s in ch.seqs.values())

    def prune(self) -> None:
        ranks = self.all_ranks()
        for ch in self.channels.values():
            ch.prune(ranks)

    def first_divergence(
        self, ended: dict[int, str | None], now: float, hang_after: float | None, final: bool
    ) -> dict | None:
        ranks = self.all_ranks()
        waits = wait_state(self.channels, ranks, ended, self.thread_last)
        found = [
            f
            for ch in self.channels.values()
            if (
                f := find_divergence(
                    ch, ranks, ended, now, hang_after, final, waits=waits, sources=self.sources, traced=self.traced
                )
            )
            is not None
        ]
        # A rank missing from one group is often a consequence of its own divergent
        # call in another group: prefer a finding that names a call over a missing one;
        # a wait cycle that no inserted call explains is its own finding.
        best = min(found, key=lambda f: (f["kind"] == "wait_cycle", bool(f.get("waiting_on")), f["time"]), default=None)
        if best is not None and best["kind"] == "wait_cycle" and waits.calls:
            head = waits.calls[0]
            times = [e["w"] for e in waits.events.values() if e.get("w") is not None]
            best = {
                "channel": head["group"],
                "seq": head["seq"],
                "kind": "wait_cycle",
                "culprits": sorted(waits.events),
                "events": dict(waits.events),
                "time": min(times) if times else 0.0,
                "deadlock": waits.cycle,
                "cycle": list(waits.calls),
                "cause_rank": head["rank"],
                "cause_seq": head["seq"],
                "cause_event": waits.events.get(head["rank"]),
                "confidence": "high",
                "basis": "the ranks wait for each other across groups: " + waits.cycle,
            }
            if len(waits.calls) == 2:
                best = self._cycle_of_two(best, waits)
        return best

    def _cycle_of_two(self, best: dict, waits) -> dict:
        """Two ranks, each waiting in another channel for the other: often one of the two calls is
        extra there (a rank-0-only new_group, a barrier one rank skipped). Which one is weighed as
        for any unmatched pair (blame.explain_cycle): how often each rank made that call before
        (a call both always made is the one the other skipped), then the program's branches, then
        a call from a place its channel never used. Undecided: the cycle itself, both ranks."""
        ca, cb = waits.calls
        evs = (waits.events[ca["rank"]], waits.events[cb["rank"]])
        made = []
        for c, ev in zip((ca, cb), evs):
            ch = self.channels.get(c["group"])
            key = pattern_key(ev)
            other = cb["rank"] if c is ca else ca["rank"]
            counts = {}
            for r in (c["rank"], other):
                seq = list(ch.seqs.get(r, ())) if ch is not None else []
                upto = next((i for i, e in enumerate(seq) if e is ev), len(seq))
                counts[r] = (ch.history.calls(r, key) if ch is not None else 0) + sum(
                    1 for e in seq[:upto] if pattern_key(e) == key
                )
            # a place the channel never used, in a channel that was used before (a fresh group says nothing)
            used = ch is not None and (ch.seen_sites or any(e is not ev for s in ch.seqs.values() for e in s))
            novel = (
                bool(used)
                and site_key(ev) not in ch.seen_sites
                and not any(site_key(e) == site_key(ev) and e is not ev for s in ch.seqs.values() for e in s)
            )
            if "dir" in ev:  # a send and its receive are one flow from two places: no per-place counts
                counts = {c["rank"]: 0, other: 0}
            made.append((counts[c["rank"]], counts[other], novel))
        got = blame.explain_cycle(evs[0], evs[1], self.sources, made)
        if got is None:
            return best
        side, kind, why = got
        c, other = (ca, cb)[side], (cb, ca)[side]
        culprit = c["rank"] if kind == "extra" else other["rank"]
        if c["group"] == GROUPS:
            kind = "group"
        best = dict(
            best,
            kind=kind,
            culprits=[culprit],
            cause_rank=c["rank"],
            cause_seq=c["seq"],
            cause_event=evs[side],
            channel=c["group"],
            seq=c["seq"],
            confidence="medium",
            waiting_on=False,
            basis=f"{why}; the ranks wait for each other ({waits.cycle})",
            events={r: (waits.events[r] if r == c["rank"] else None) for r in waits.events},
        )
        return best

    def cross_site_pairings(self, finding: dict | None, limit: int = 100) -> list[dict]:
        """Equal calls paired across call sites, one entry per pair of places: those
        at or after the reported divergence in its group are not legitimate."""
        out = []
        for ch in self.channels.values():
            for combo, p in pairings_of(ch.pattern, ch.window_pairings).items():
                after = finding is not None and finding["channel"] == ch.key and p["seq"] >= finding["seq"]
                ranks = {
                    str(r): {"site": e.get("site"), "caller": caller_text(k)}
                    for (r, e), k in zip(sorted(p["events"].items()), combo)
                }
                out.append(
                    {"group": ch.key, "seq": p["seq"], "count": p["count"], "ranks": ranks, "legitimate": not after}
                )
        return sorted(out, key=lambda e: (e["group"], e["seq"]))[:limit]

    def blocked(self) -> dict[int, dict]:
        """Each rank's calls that never returned (a call that raised is over, not blocked)."""
        out: dict[int, dict] = {}
        for ch in self.channels.values():
            for r, seq in ch.seqs.items():
                for ev in seq:
                    if ev["state"] == "blocked":
                        out.setdefault(r, ev)
        return out


def _call(ev: dict | None) -> Call:
    """A recorded call as the report names it."""
    if ev is None:
        return Call(None)
    return Call(
        ev["op"],
        ev.get("site"),
        ev.get("fn"),
        ev.get("g"),
        ev.get("sh", []),
        ev.get("dt", []),
        ev.get("ro"),
        ev.get("root") if "dir" not in ev else ev.get("peer"),
        ev.get("label"),
        [s.rsplit("/", 1)[-1] for s in ev.get("stack", [])],
    )


def _rank_entry(ev: dict | None, last: dict | None) -> RankCall:
    if ev is None:
        return RankCall(
            None,
            state="absent",
            last_seen=f"{last['op']} at {last.get('site')} ({last['g']})" if last is not None else None,
        )
    c = _call(ev)
    return RankCall(
        c.op,
        c.site,
        c.function,
        None,
        c.shapes,
        c.dtypes,
        c.reduce_op,
        c.root,
        c.label,
        c.stack,
        state="completed" if ev["state"] == "completed" else "blocked",
    )


def symptoms(
    tracker: Tracker, ended: dict[int, str | None], errors: dict[int, str] | None = None
) -> dict[int, Symptom]:
    """Where each rank was when the run ended: the call it blocked or failed in (its latest
    one), else its last call and how it ended."""
    open_calls: dict[int, dict] = {}
    for ch in tracker.channels.values():
        for r, seq in ch.seqs.items():
            for ev in seq:
                if ev["state"] != "completed" and (
                    r not in open_calls or (ev.get("t") or 0) >= (open_calls[r].get("t") or 0)
                ):
                    open_calls[r] = ev
    out = {}
    for r in tracker.all_ranks():
        ev = open_calls.get(r)
        state = ended.get(r)
        if ev is not None:
            sym = Symptom(
                "failed" if ev["state"] == "failed" else "blocked", _call(ev), _seq_of(tracker, ev), ev.get("err")
            )
        else:
            last = tracker.last_event.get(r)
            sym = Symptom(
                {"clean": "ended", "crashed": "crashed"}.get(state or "", "running" if last else "absent"), _call(last)
            )
        if state == "crashed" and errors and errors.get(r) and not sym.error:
            sym.error = errors[r]
        out[r] = sym
    return out


def _seq_of(tracker: Tracker, ev: dict) -> int | None:
    ch = tracker.channels.get(route(ev, tracker.groups) or "")
    if ch is None:
        return None
    seq = ch.seqs.get(ev["rank"], ())
    for i, e in enumerate(seq):
        if e is ev:
            return ch.base + i
    return None


def divergence(tracker: Tracker, ended: dict[int, str | None], finding: dict, errors: dict | None) -> Divergence:
    if finding["channel"] == GROUPS and finding["kind"] in ("label", "extra", "missing", "op"):
        finding["kind"] = "group"  # the ranks created different groups, or in another order
    kind = Kind(finding["kind"])
    cause = None
    if finding.get("cause_event") is not None:
        cause = Cause(
            finding["cause_rank"],
            finding["cause_seq"],
            kind,
            finding["culprits"],
            _call(finding["cause_event"]),
            finding.get("after"),
        )
    return Divergence(
        finding["channel"],
        finding["seq"],
        kind,
        finding["culprits"],
        {r: _rank_entry(e, tracker.last_event.get(r)) for r, e in sorted(finding["events"].items())},
        cause,
        symptoms(tracker, ended, errors),
        Confidence(finding.get("confidence", "high")),
        finding.get("basis"),
        finding.get("alternative"),
        finding.get("deadlock"),
        list(finding.get("cycle", [])),
        bool(finding.get("waiting_on")),
    )


def build_report(
    tracker: Tracker,
    ended: dict[int, str | None],
    finding: dict | None,
    stacks: dict[str, str] | None,
    final: bool,
    seen: dict | None = None,
) -> Report:
    """The report (docs/contracts.md). seen: what the analysis saw of the run (coverage):
    {"ranks": ranks with a trace of this run, "foreign": trace files of anything else,
    "errors": rank -> how it ended, "timed_out": hctool ended ranks still running}."""
    seen = seen or {}
    ranks = tracker.all_ranks()
    crashed = [r for r in ranks if ended.get(r) == "crashed"]
    first = None
    reason = None
    if finding is not None:
        first = divergence(tracker, ended, finding, seen.get("errors"))
        if first.kind is Kind.WAIT_CYCLE:
            verdict = Verdict.HUNG
        elif first.kind is Kind.MISSING and finding.get("waiting_on"):
            culprit_states = {ended.get(r) for r in first.culprit_ranks}
            verdict = (
                Verdict.CRASHED
                if "crashed" in culprit_states
                else (Verdict.HUNG if None in culprit_states else Verdict.DIVERGED)
            )
        else:
            verdict = Verdict.DIVERGED
    elif crashed:
        verdict = Verdict.CRASHED
        reason = f"rank(s) {', '.join(map(str, crashed))} ended abnormally; no divergent collective explains it"
    elif tracker.blocked():
        verdict, reason = Verdict.HUNG, "calls were still waiting when the run ended"
    else:
        verdict, reason = earned(tracker, ended, final, seen)
    counts = {str(r): dict(sorted(tracker.counts.get(r, {}).items())) for r in ranks}
    return Report(
        verdict,
        tracker.world_size or len(ranks),
        first,
        dict(stacks or {}),
        counts,
        reason,
        coverage(tracker, ended, seen),
        tracker.cross_site_pairings(finding),
    )


def coverage(tracker: Tracker, ended: dict[int, str | None], seen: dict) -> Coverage:
    """What the verdict rests on: the ranks expected, those whose trace of this run was read,
    those that recorded calls, and how each ended."""
    return Coverage(
        tracker.world_size or 0,
        sorted(seen.get("ranks", tracker.ranks)),
        sorted(r for r, ops in tracker.counts.items() if ops),
        {r: ended.get(r) or "running" for r in tracker.all_ranks()},
        sorted(seen.get("foreign") or [])[:20],
    )


def earned(tracker: Tracker, ended: dict[int, str | None], final: bool, seen: dict) -> tuple[Verdict, str | None]:
    """`consistent` only for a run seen whole: every expected rank's trace of this run, from its
    process group's start to its end, with calls recorded, every rank ended cleanly. Anything
    less is named (docs/consensus.md "Verdicts")."""
    traced = set(seen.get("ranks", tracker.ranks))
    foreign = seen.get("foreign") or []
    expected = tracker.world_size or 0
    dropped = (
        f"; {len(foreign)} trace file(s) in the folder were not written by this run and were not read"
        if foreign
        else ""
    )
    if not traced:
        if seen.get("timed_out"):
            return Verdict.NO_PROCESS_GROUP, (
                "the run was ended by --timeout before any rank formed a process group" + dropped
            )
        return Verdict.NO_PROCESS_GROUP, (
            "no rank recorded anything: no process group was formed (the program "
            "never called init_process_group, or is not a torch.distributed program)" + dropped
        )
    missing = sorted(set(range(expected)) - traced) if expected else []
    if missing:
        return Verdict.INCOMPLETE, (
            f"rank(s) {', '.join(map(str, missing[:16]))} of {expected} left no trace of this run" + dropped
        )
    if not any(tracker.counts.get(r) for r in traced):
        if seen.get("timed_out") or any(ended.get(r) is None for r in traced):
            return Verdict.INCOMPLETE, "the run was ended before any rank made a collective call" + dropped
        return Verdict.NO_COLLECTIVES, "the ranks formed their process group and ended without any collective call"
    running = sorted(r for r in tracker.all_ranks() if ended.get(r) is None)
    if running and final:
        return Verdict.INCOMPLETE, (
            f"rank(s) {', '.join(map(str, running[:16]))} were still running, outside any "
            f"collective, when the run was ended"
        )
    return Verdict.CONSISTENT, None


def ended_states(
    reader_ranks: dict, exit_codes: dict[int, int | None] | None, ranks: list[int], ended_at: float | None = None
) -> dict[int, str | None]:
    """Per rank: None (running or killed by hctool), "clean" or "crashed".
    Exit codes, when the caller knows them, win over the traces' end records.
    ended_at: when hctool began ending the job (monotonic); an end record a rank
    still running then wrote after it is hctool's doing, not how the rank ended."""
    out: dict[int, str | None] = {}
    for r in ranks:
        rt = reader_ranks.get(r)
        out[r] = rt.ended if rt is not None else None
        if (
            ended_at is not None
            and rt is not None
            and rt.end_t is not None
            and rt.end_t > ended_at
            and exit_codes
            and r in exit_codes
            and exit_codes[r] is None
        ):
            out[r] = None
        if exit_codes and r in exit_codes:
            code = exit_codes[r]
            if code is not None:  # a live process may already have written its end record
                out[r] = "clean" if code == 0 else "crashed"
    return out


def _check_world(reader: TraceDirReader, known: set[int]) -> None:
    ws = reader.world_size
    if ws is None:
        return
    beyond = sorted(r for r in known if r >= ws)
    if beyond:
        raise TraceError(f"{reader.path}: rank {beyond[0]} has a trace but the headers say world_size {ws}")
    if ws - len(known) > MAX_MISSING_RANKS:
        raise TraceError(f"{reader.path}: a header claims world_size {ws} but only {len(known)} rank(s) have traces")


class AnalysisSession:
    """One job's traces, read incrementally into one Tracker: the live watcher (check() every
    ~0.2 s while the job runs) and the offline analyzer (in rounds, until the files end) are its
    two users, so both read, fold and report the same way."""

    def __init__(self, trace_dir, world_size: int | None = None, strict: bool = False, columns: bool | None = None):
        from hctool.consensus.columns import Interner
        from hctool.protocol import env as protocol_env

        if columns is None:
            columns = os.environ.get(protocol_env.ANALYZE_COLUMNS, "1") != "0"
        self.interner = Interner() if columns else None  # the fast path (consensus/columns.py)
        self.reader = TraceDirReader(os.fspath(trace_dir), strict=strict, interner=self.interner)
        self.tracker = Tracker()
        self.tracker.world_size = world_size
        self.strict = strict
        self.incomplete: list[dict] = []  # ranks whose full trace folder cut their trace short

    def feed(self, now: float, known_ranks=()) -> int:
        """Fold what the files gained since the last call; drop the prefix every member agreed on
        and completed (memory stays bounded on long runs). Returns the events read."""
        events = self.reader.poll()
        if self.strict:
            _check_world(self.reader, set(self.reader.ranks) | set(known_ranks))
        if self.reader.world_size and (self.strict or not self.tracker.world_size):
            self.tracker.world_size = self.reader.world_size
        self.tracker.groups.update(self.reader.groups)
        self.tracker.traced = set(self.reader.ranks)
        if self.reader.blocks:  # they precede every event of their channel in this poll
            self.tracker.add_blocks(self.reader.blocks, self.interner, now)
        for ev in events:
            self.tracker.add(ev, now)
        self.tracker.prune()
        # A rank whose folder filled up: its later calls are unknown, not absent (truncation.py).
        # Cut only once every file is read to its end: a round that holds fewer of that rank's
        # calls than of its peers' would otherwise drop peers' calls that are never read again.
        if not self.reader.more:
            self.incomplete = truncation.cut(self.tracker, self.reader.ranks)
        return len(events) + sum(len(b) for _, _, b in self.reader.blocks)

    def cut(self) -> None:
        """The truncation cut for a reader stopped with data left (see feed)."""
        self.incomplete = truncation.cut(self.tracker, self.reader.ranks)

    def ended(self, exit_codes: dict[int, int | None] | None, ended_at: float | None = None) -> dict[int, str | None]:
        ranks = sorted(set(self.tracker.all_ranks()) | set(exit_codes or {}))
        return ended_states(self.reader.ranks, exit_codes, ranks, ended_at)

    def seen(self, timed_out: bool = False) -> dict:
        """What this session saw of the run (the verdict's coverage)."""
        return {
            "ranks": set(self.reader.ranks),
            "foreign": sorted(self.reader.foreign),
            "errors": {r: rt.end_error for r, rt in self.reader.ranks.items() if rt.end_error},
            "timed_out": timed_out,
        }

    def report(
        self,
        ended: dict[int, str | None],
        now: float,
        hang_after: float | None,
        final: bool,
        stacks: dict[str, str] | None = None,
        timed_out: bool = False,
    ) -> tuple[Report, dict | None]:
        """(report, finding): the first divergence given what ended, with probes annotated."""
        finding = self.tracker.first_divergence(ended, now, hang_after=hang_after, final=final)
        report = build_report(self.tracker, ended, finding, stacks, final=final, seen=self.seen(timed_out))
        if self.incomplete:
            report.incomplete = self.incomplete
            if report.verdict is Verdict.CONSISTENT:
                report.verdict = Verdict.INCOMPLETE
                report.reason = "; ".join(truncation.describe(e) for e in self.incomplete)
        return probes.annotate(report, self.reader.ranks, finding), finding


def feed_flight_recorder(tracker: Tracker, path: str, now: float):
    """A folder of Flight Recorder dumps into the tracker: per channel (a group's collectives, a
    p2p flow), the calls every member still holds, folded as columns where every member agrees
    (consensus/columns.py). A rank the groups name that left no dump is set aside here
    (`_no_dump` names it)."""
    import numpy as np

    from hctool.consensus import flight_recorder as fr
    from hctool.consensus.columns import Block, Interner

    dumps = fr.read_all(path)
    plan = fr.plan(dumps)
    have = {d.rank for d in dumps}
    tracker.groups.update({g: [r for r in rs if r in have] for g, rs in plan.members.items()})
    tracker.world_size = len(plan.expected)
    tracker.traced = have
    interner = Interner()
    blocks, later = [], []
    for d in dumps:
        # per channel, in order: the calls' kinds, times and states (arrays), and how to make an event
        channels: list[tuple] = []
        coll = _kind_table(d, interner, [None if "dir" in ev else ev for ev in d.kinds]) if d.calls else None
        for g, (kinds, seqs, ts, done) in d.calls.items():
            keep = seqs >= plan.start.get(g, 0)
            channels.append((g, "c", g, kinds[keep], ts[keep], done[keep], coll))
        groups, gi, kinds, seqs, ts, done = d.p2p
        for j, g in enumerate(groups):
            sel = (gi == j) & (seqs >= plan.p2p_start.get(g, 0))
            evs = [fr.p2p_event(d, plan, g, k, 0.0, True) for k in range(len(d.kinds))]
            table = _kind_table(d, interner, [e if e is not None and "dir" in e else None for e in evs])
            for k in np.unique(kinds[sel]).tolist():
                ev = evs[k]
                if ev is None or ev["peer"] not in have:
                    continue  # a peer with no dump: nothing to compare the flow with
                ks = sel & (kinds == k)
                channels.append((route(ev, tracker.groups), "p", g, kinds[ks], ts[ks], done[ks], table))
        merged: dict[str, list] = {}
        for ch_key, *rest in channels:  # several p2p kinds of one flow: one channel, in time order
            merged.setdefault(ch_key, []).append(rest)
        for ch_key, parts in merged.items():
            what, g = parts[0][0], parts[0][1]
            kinds = np.concatenate([p[2] for p in parts])
            ts = np.concatenate([p[3] for p in parts])
            done = np.concatenate([p[4] for p in parts])
            table = parts[0][5]
            if len(parts) > 1:
                order = np.argsort(ts, kind="stable")
                kinds, ts, done = kinds[order], ts[order], done[order]

            def make(i, kinds=kinds, ts=ts, done=done, what=what, g=g, d=d):
                k, ti, c = int(kinds[i]), float(ts[i]), bool(done[i])
                return fr.event(d, g, k, ti, c) if what == "c" else fr.p2p_event(d, plan, g, k, ti, c)

            lead = int(np.argmin(done)) if len(done) and not done.all() else len(done)  # the completed run first
            if lead:
                ids = table[kinds[:lead]]
                blocks.append(
                    (
                        d.rank,
                        ch_key,
                        Block(d.rank, ids[:, 0], ids[:, 1], ids[:, 2], make, ts[:lead], np.zeros(lead, dtype=np.int64)),
                    )
                )
            later += [make(i) for i in range(lead, len(kinds))]
    for _rank, channel, _block in blocks:  # p2p channels take their two ranks as members
        if " p2p " in channel and channel not in tracker.channels:
            src, dst = channel.rsplit(" ", 1)[1].split("->")
            tracker.channels[channel] = Channel(channel, sorted({int(src), int(dst)}))
    tracker.add_blocks(blocks, interner, now, final=True)
    for ev in sorted(later, key=lambda e: e["t"]):
        if (ev["rank"], route(ev, tracker.groups)) in tracker.capped:
            tracker.counts.setdefault(ev["rank"], {})[ev["op"]] = (
                tracker.counts.get(ev["rank"], {}).get(ev["op"], 0) + 1
            )
            tracker._note(ev)  # beyond what is compared: only where the rank was
        else:
            tracker.add(ev, now)
    tracker.prune()
    return plan


def _kind_table(d, interner, templates: list):
    """Per kind of a dump: (hard signature id, call-site key id, op id), as the interner keys them."""
    import numpy as np

    rows = []
    for ev in templates:
        if ev is None:
            rows.append((-1, -1, 0))
            continue
        probe = dict(ev, rank=d.rank)
        rows.append((interner.hard_id(probe), interner.key_id(probe), interner.op_id(ev["op"])))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def _no_dump(report: Report, plan, tracker: Tracker, ended: dict) -> None:
    """Ranks the groups name that left no dump: named, never silently dropped. With no divergence
    among the others they are the finding: the ranks whose calls still wait in a group with such
    a rank wait for it (hung, `missing`, never reached); else the run is incomplete."""
    missing = plan.missing
    words = f"rank(s) {ranges(missing)} of {len(plan.expected)} left no Flight Recorder dump"
    if report.coverage is not None:
        report.coverage.expected_ranks = len(plan.expected)
    if report.first_divergence is not None:
        report.reason = words + (f"; {report.reason}" if report.reason else "")
        return
    waiting = [
        (ch, ev)
        for ch in tracker.channels.values()
        for seq in ch.seqs.values()
        for ev in seq
        if ev["state"] == "blocked" and set(plan.members.get(ev["g"], ())) & set(missing)
    ]
    if not waiting:
        report.verdict = Verdict.INCOMPLETE
        report.reason = (
            f"{words} (the process died, or never dumped); the {len(plan.dumps)} dumps there agree "
            f"as far as every rank's buffer goes"
        )
        return
    ch, ev = min(waiting, key=lambda w: w[1].get("t") or 0.0)
    absent = sorted(set(plan.members.get(ev["g"], ())) & set(missing))
    seq = next(ch.base + i for i, e in enumerate(ch.seqs[ev["rank"]]) if e is ev)
    waiters = sorted({e["rank"] for _, e in waiting})
    finding = {
        "channel": ch.key,
        "seq": seq,
        "kind": "missing",
        "culprits": absent,
        "time": ev.get("t") or 0.0,
        "events": {ev["rank"]: ev, **{r: None for r in absent}},
        "cause_rank": ev["rank"],
        "cause_seq": seq,
        "cause_event": ev,
        "confidence": "high",
        "waiting_on": True,
        "basis": f"{words}, while rank(s) {ranges(waiters)} wait in calls of groups with it "
        f"(their last entries are still scheduled): it never reached them",
    }
    report.first_divergence = divergence(tracker, ended, finding, None)
    report.verdict = Verdict.HUNG
    report.reason = None


def analyze_dir(
    path,
    exit_codes: dict[int, int | None] | None = None,
    stacks: dict[str, str] | None = None,
    command_exit: int | None = None,
    ended_at: float | None = None,
) -> Report:
    """The report for a trace folder (or Flight Recorder dumps). exit_codes: what
    the caller knows of each rank's exit (None: still running when it was ended);
    command_exit: the exit code of a wrapper command (torchrun ...); ended_at: when
    hctool began ending the ranks still running (monotonic, see ended_states).
    Raises TraceError (one line) for a folder hctool cannot read."""
    path = os.fspath(path)
    tracker = Tracker()
    now = time.monotonic()
    session = None
    fr_plan = None
    if not trace_files(path) and is_flight_recorder_dir(path):
        fr_plan = feed_flight_recorder(tracker, path, now)
        # A Flight Recorder dump says nothing about exits; the dump itself means the rank got there.
        ended = {d.rank: "clean" for d in fr_plan.dumps}
        if exit_codes:
            ended.update({r: None if c is None else ("clean" if c == 0 else "crashed") for r, c in exit_codes.items()})
        if not stacks:  # each rank's "stack": the frames of its last entry (what the job was doing when it dumped)
            stacks = {
                str(d.rank): '(Flight Recorder: the frames of its last entry)\nThread 0 (dumped): "MainThread"\n'
                + "\n".join(f"    {f}" for f in d.last_frames)
                for d in fr_plan.dumps
                if d.last_frames
            }
    else:
        session = AnalysisSession(path, strict=True)
        tracker = session.tracker
        while True:  # in rounds, dropping the agreed prefix: memory stays bounded on long traces
            session.feed(now, exit_codes or {})
            if not session.reader.more:
                break
            if tracker.pending() > MAX_PENDING:
                session.cut()
                break
        ended = session.ended(exit_codes, ended_at)
        if exit_codes is None:
            # No end record and no exit code: the process died without atexit (SIGKILL, abort).
            ended = {r: ("crashed" if s is None and r in session.reader.ranks else s) for r, s in ended.items()}
    tracker.ranks.update(exit_codes or {})
    if ended_at is not None:  # a call that failed when hctool ended its rank was still waiting
        for ch in tracker.channels.values():
            for seq in ch.seqs.values():
                for ev in seq:
                    if ev["state"] == "failed" and (ev.get("t_done") or 0.0) > ended_at:
                        ev["state"] = "blocked"
    tracker.prune()
    if session is not None:
        timed_out = ended_at is not None and any(c is None for c in (exit_codes or {}).values())
        report, _ = session.report(ended, now, None, final=True, stacks=stacks, timed_out=timed_out)
    else:
        report = build_report(
            tracker,
            ended,
            tracker.first_divergence(ended, now, hang_after=None, final=True),
            stacks,
            final=True,
            seen={"ranks": set(tracker.ranks)},
        )
        if fr_plan is not None and fr_plan.missing:
            _no_dump(report, fr_plan, tracker, ended)
    if exit_codes is not None:
        report.exit_codes = {str(r): c for r, c in sorted(exit_codes.items())}
    if command_exit is not None:
        report.command_exit_code = command_exit
        if command_exit != 0 and (report.verdict is Verdict.CONSISTENT or not report.verdict.seen):
            # a failed command is never a clean run
            why = f"the command exited with code {command_exit}"
            report.reason = why + (f"; {report.reason}" if report.reason else "")
            report.verdict = Verdict.CRASHED
    return report
