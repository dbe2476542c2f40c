"""From traces to the check-consensus report (docs/contracts.md)."""

from __future__ import annotations

import os
import time

from hctool.consensus import probes, truncation
from hctool.consensus.align import Channel, channel_members, find_divergence, route
from hctool.consensus.flight_recorder import is_flight_recorder_dir, read_flight_recorder
from hctool.consensus.pattern import caller_text, pairings_of
from hctool.consensus.trace import TraceDirReader, TraceError, trace_files
from hctool.consensus.waits import wait_state

MAX_MISSING_RANKS = 1024      # ranks a header may claim beyond the trace files present
MAX_PENDING = 1_000_000       # unagreed events held before the analysis stops reading


class Tracker:
    """Channels fed from events; shared by the offline analyzer and LiveWatcher."""

    def __init__(self) -> None:
        self.channels: dict[str, Channel] = {}
        self.groups: dict[str, list[int]] = {}
        self.ranks: set[int] = set()
        self.world_size: int | None = None
        self.last_event: dict[int, dict] = {}
        self.thread_last: dict[tuple, dict] = {}  # (rank, thread) -> latest event (align.wait_state)
        self.counts: dict[int, dict[str, int]] = {}   # rank -> op -> calls seen (evidence of what was checked)

    def add(self, ev: dict, now: float) -> None:
        per_op = self.counts.setdefault(ev["rank"], {})
        per_op[ev["op"]] = per_op.get(ev["op"], 0) + 1
        key = route(ev, self.groups)
        if key is None:
            return
        ch = self.channels.get(key)
        if ch is None:
            members = None if ev["g"] == "labels" else channel_members(key, self.groups)
            if " p2p " in key:
                members = sorted({ev["rank"], ev["peer"]})
            ch = self.channels[key] = Channel(key, members)
        ch.add(ev, now)
        self.ranks.add(ev["rank"])
        self.last_event[ev["rank"]] = ev
        self.thread_last[(ev["rank"], ev.get("th"))] = ev

    def all_ranks(self) -> list[int]:
        n = self.world_size or 0
        return sorted(self.ranks | set(range(n)))

    def pending(self) -> int:
        return sum(len(s) for ch in self.channels.values() for s in ch.seqs.values())

    def prune(self) -> None:
        ranks = self.all_ranks()
        for ch in self.channels.values():
            ch.prune(ranks)

    def first_divergence(self, ended: dict[int, str | None], now: float, hang_after: float | None,
                         final: bool) -> dict | None:
        ranks = self.all_ranks()
        waits = wait_state(self.channels, ranks, ended, self.thread_last)
        found = [f for ch in self.channels.values()
                 if (f := find_divergence(ch, ranks, ended, now, hang_after, final, waits=waits)) is not None]
        # A rank missing from one group is often a consequence of its own divergent
        # call in another group: prefer a finding that names a call over a missing one;
        # a wait cycle that no inserted call explains is its own finding.
        best = min(found, key=lambda f: (f["kind"] in ("missing", "wait_cycle"), f["kind"] == "missing", f["time"]),
                   default=None)
        if best is not None and best["kind"] == "wait_cycle" and waits.calls:
            head = waits.calls[0]
            times = [e["w"] for e in waits.events.values() if e.get("w") is not None]
            best = {"channel": head["group"], "seq": head["seq"], "kind": "wait_cycle",
                    "culprits": sorted(waits.events), "events": dict(waits.events),
                    "time": min(times) if times else 0.0, "deadlock": waits.cycle, "cycle": list(waits.calls)}
        return best

    def cross_site_pairings(self, finding: dict | None, limit: int = 100) -> list[dict]:
        """Equal calls paired across call sites, one entry per pair of places: those
        at or after the reported divergence in its group are not legitimate."""
        out = []
        for ch in self.channels.values():
            for combo, p in pairings_of(ch.pattern, ch.window_pairings).items():
                after = finding is not None and finding["channel"] == ch.key and p["seq"] >= finding["seq"]
                ranks = {str(r): {"site": e.get("site"), "caller": caller_text(k)}
                         for (r, e), k in zip(sorted(p["events"].items()), combo)}
                out.append({"group": ch.key, "seq": p["seq"], "count": p["count"], "ranks": ranks,
                            "legitimate": not after})
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


def _rank_entry(ev: dict | None, last: dict | None) -> dict:
    if ev is None:
        entry = {"op": None, "site": None, "function": None, "shapes": [], "dtypes": [], "reduce_op": None,
                 "root": None, "label": None, "state": "absent"}
        if last is not None:
            entry["last_seen"] = f"{last['op']} at {last.get('site')} ({last['g']})"
        return entry
    entry = {"op": ev["op"], "site": ev.get("site"), "function": ev.get("fn"), "shapes": ev.get("sh", []),
             "dtypes": ev.get("dt", []), "reduce_op": ev.get("ro"),
             "root": ev.get("root") if "dir" not in ev else ev.get("peer"),
             "label": ev.get("label"), "state": "completed" if ev["state"] == "completed" else "blocked",
             "stack": [s.rsplit("/", 1)[-1] for s in ev.get("stack", [])]}
    return entry


def build_report(tracker: Tracker, ended: dict[int, str | None], finding: dict | None,
                 stacks: dict[str, str] | None, final: bool) -> dict:
    ranks = tracker.all_ranks()
    crashed = [r for r in ranks if ended.get(r) == "crashed"]
    first = None
    if finding is not None:
        first = {"group": finding["channel"], "seq": finding["seq"], "kind": finding["kind"],
                 "culprit_ranks": finding["culprits"],
                 "ranks": {str(r): _rank_entry(e, tracker.last_event.get(r)) for r, e in sorted(finding["events"].items())}}
        if finding.get("deadlock"):
            first["deadlock"] = finding["deadlock"]  # the wait cycle across groups, in words
            first["cycle"] = finding.get("cycle", [])
        if finding["kind"] == "wait_cycle":
            verdict = "hung"
        elif finding["kind"] == "missing":
            culprit_states = {ended.get(r) for r in finding["culprits"]}
            verdict = "crashed" if "crashed" in culprit_states else ("hung" if None in culprit_states else "diverged")
        else:
            verdict = "diverged"
    elif crashed:
        verdict = "crashed"
    elif tracker.blocked() or (final and any(ended.get(r) is None for r in ranks)):
        verdict = "hung"
    else:
        verdict = "consistent"
    counts = {str(r): dict(sorted(tracker.counts.get(r, {}).items())) for r in ranks}
    report = {"verdict": verdict, "world_size": tracker.world_size or len(ranks), "first_divergence": first,
              "stacks": dict(stacks or {}), "counts": counts}
    pairings = tracker.cross_site_pairings(finding)
    if pairings:  # only where calls paired across call sites: a plain program's report stays as it was
        report["cross_site_pairings"] = pairings
    return report


def ended_states(reader_ranks: dict, exit_codes: dict[int, int | None] | None, ranks: list[int],
                 ended_at: float | None = None) -> dict[int, str | None]:
    """Per rank: None (running or killed by hctool), "clean" or "crashed".
    Exit codes, when the caller knows them, win over the traces' end records.
    ended_at: when hctool began ending the job (monotonic); an end record a rank
    still running then wrote after it is hctool's doing, not how the rank ended."""
    out: dict[int, str | None] = {}
    for r in ranks:
        rt = reader_ranks.get(r)
        out[r] = rt.ended if rt is not None else None
        if (ended_at is not None and rt is not None and rt.end_t is not None and rt.end_t > ended_at
                and exit_codes and r in exit_codes and exit_codes[r] is None):
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
        raise TraceError(f"{reader.path}: a header claims world_size {ws} but only {len(known)} rank(s) "
                         f"have traces")


class AnalysisSession:
    """One job's traces, read incrementally into one Tracker: the live watcher (check() every
    ~0.2 s while the job runs) and the offline analyzer (in rounds, until the files end) are its
    two users, so both read, fold and report the same way."""

    def __init__(self, trace_dir, world_size: int | None = None, strict: bool = False):
        self.reader = TraceDirReader(os.fspath(trace_dir), strict=strict)
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
        for ev in events:
            self.tracker.add(ev, now)
        self.tracker.prune()
        # A rank whose folder filled up: its later calls are unknown, not absent (truncation.py).
        # Cut only once every file is read to its end: a round that holds fewer of that rank's
        # calls than of its peers' would otherwise drop peers' calls that are never read again.
        if not self.reader.more:
            self.incomplete = truncation.cut(self.tracker, self.reader.ranks)
        return len(events)

    def cut(self) -> None:
        """The truncation cut for a reader stopped with data left (see feed)."""
        self.incomplete = truncation.cut(self.tracker, self.reader.ranks)

    def ended(self, exit_codes: dict[int, int | None] | None, ended_at: float | None = None) -> dict[int, str | None]:
        ranks = sorted(set(self.tracker.all_ranks()) | set(exit_codes or {}))
        return ended_states(self.reader.ranks, exit_codes, ranks, ended_at)

    def report(self, ended: dict[int, str | None], now: float, hang_after: float | None, final: bool,
               stacks: dict[str, str] | None = None) -> tuple[dict, dict | None]:
        """(report, finding): the first divergence given what ended, with probes annotated."""
        finding = self.tracker.first_divergence(ended, now, hang_after=hang_after, final=final)
        report = build_report(self.tracker, ended, finding, stacks, final=final)
        if self.incomplete:
            report["incomplete"] = self.incomplete
        return probes.annotate(report, self.reader.ranks, finding), finding


def analyze_dir(path, exit_codes: dict[int, int | None] | None = None, stacks: dict[str, str] | None = None,
                command_exit: int | None = None, ended_at: float | None = None) -> dict:
    """The report for a trace folder (or Flight Recorder dumps). exit_codes: what
    the caller knows of each rank's exit (None: still running when it was ended);
    command_exit: the exit code of a wrapper command (torchrun ...); ended_at: when
    hctool began ending the ranks still running (monotonic, see ended_states).
    Raises TraceError (one line) for a folder hctool cannot read."""
    path = os.fspath(path)
    tracker = Tracker()
    now = time.monotonic()
    session = None
    if not trace_files(path) and is_flight_recorder_dir(path):
        per_rank, groups = read_flight_recorder(path)
        tracker.groups.update(groups)
        tracker.world_size = len(per_rank)
        for r in sorted(per_rank):
            for ev in per_rank[r]:
                tracker.add(ev, now)
        # A Flight Recorder dump says nothing about exits; the dump itself means the rank got there.
        ended = {r: "clean" for r in per_rank}
        if exit_codes:
            ended.update({r: None if c is None else ("clean" if c == 0 else "crashed") for r, c in exit_codes.items()})
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
        report, _ = session.report(ended, now, None, final=True, stacks=stacks)
    else:
        report = build_report(tracker, ended, tracker.first_divergence(ended, now, hang_after=None, final=True),
                              stacks, final=True)
    if exit_codes is not None:
        report["exit_codes"] = {str(r): c for r, c in sorted(exit_codes.items())}
    if command_exit is not None:
        report["command_exit_code"] = command_exit
        if command_exit != 0 and report["verdict"] == "consistent":
            report["verdict"] = "crashed"  # a failed command is never a clean run
    return report
