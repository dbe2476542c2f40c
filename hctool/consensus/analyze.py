"""From traces to the check-consensus report (docs/contracts.md)."""

from __future__ import annotations

import os
import time

from hctool.consensus import probes, truncation
from hctool.consensus.align import Channel, channel_members, find_divergence, route
from hctool.consensus.flight_recorder import is_flight_recorder_dir, read_flight_recorder
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
        # call in another group: prefer a finding that names a call over a missing one.
        return min(found, key=lambda f: (f["kind"] == "missing", f["time"])) if found else None

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
        if finding["kind"] == "missing":
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
    return {"verdict": verdict, "world_size": tracker.world_size or len(ranks), "first_divergence": first,
            "stacks": dict(stacks or {}), "counts": counts}


def ended_states(reader_ranks: dict, exit_codes: dict[int, int | None] | None, ranks: list[int]) -> dict[int, str | None]:
    """Per rank: None (running or killed by hctool), "clean" or "crashed".
    Exit codes, when the caller knows them, win over the traces' end records."""
    out: dict[int, str | None] = {}
    for r in ranks:
        rt = reader_ranks.get(r)
        out[r] = rt.ended if rt is not None else None
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


def analyze_dir(path, exit_codes: dict[int, int | None] | None = None, stacks: dict[str, str] | None = None,
                command_exit: int | None = None) -> dict:
    """The report for a trace folder (or Flight Recorder dumps). exit_codes: what
    the caller knows of each rank's exit (None: still running when it was ended);
    command_exit: the exit code of a wrapper command (torchrun ...). Raises
    TraceError (one line) for a folder hctool cannot read."""
    path = os.fspath(path)
    tracker = Tracker()
    now = time.monotonic()
    reader = None
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
        reader = TraceDirReader(path, strict=True)
        while True:  # in rounds, dropping the agreed prefix: memory stays bounded on long traces
            events = reader.poll()
            _check_world(reader, set(reader.ranks) | set(exit_codes or {}))
            tracker.world_size = reader.world_size
            tracker.groups.update(reader.groups)
            for ev in events:
                tracker.add(ev, now)
            tracker.prune()
            if not reader.more or tracker.pending() > MAX_PENDING:
                break
        ended = ended_states(reader.ranks, exit_codes, sorted(set(tracker.all_ranks()) | set(exit_codes or {})))
        if exit_codes is None:
            # No end record and no exit code: the process died without atexit (SIGKILL, abort).
            ended = {r: ("crashed" if s is None and r in reader.ranks else s) for r, s in ended.items()}
    tracker.ranks.update(exit_codes or {})
    tracker.prune()
    incomplete = truncation.cut(tracker, reader.ranks) if reader is not None else []
    finding = tracker.first_divergence(ended, now, hang_after=None, final=True)
    report = build_report(tracker, ended, finding, stacks, final=True)
    if reader is not None:
        probes.annotate(report, reader.ranks, finding)
    if incomplete:
        report["incomplete"] = incomplete  # a full trace folder: compared up to there (truncation.py)
    if exit_codes is not None:
        report["exit_codes"] = {str(r): c for r, c in sorted(exit_codes.items())}
    if command_exit is not None:
        report["command_exit_code"] = command_exit
        if command_exit != 0 and report["verdict"] == "consistent":
            report["verdict"] = "crashed"  # a failed command is never a clean run
    return report
