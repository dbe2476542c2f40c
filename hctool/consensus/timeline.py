"""Every rank's calls, kept within a limit, for pictures of a run (export.py, the
HTML report).

A call's place in its channel (align.route: a group, the labels, a p2p pair)
is its sequence number there, the same number the analyzer's `seq` counts
and the order in which the transport pairs calls across ranks: the k-th call
of a group on rank 0 met the k-th on rank 1, whatever their call sites said.

The limit, per rank, and how it is kept (KEEP_RULE, also written into the
export): the WINDOW calls before and after the rank's call at the first
divergence, the TAIL last calls of the rank (where it ended or hung), and
of the rest only the calls whose sequence number is a multiple of a stride,
the smallest power of two that fits (the same stride for every rank and
channel, so what is kept on one rank still pairs with what is kept on its
peers). Reading is one pass with bounded memory.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field

from hctool.consensus.align import route
from hctool.consensus.flight_recorder import is_flight_recorder_dir, read_flight_recorder
from hctool.consensus.trace import TraceDirReader, trace_files

MAX_TAIL_S = 600.0  # a run's end is trusted this long after its last recorded call
MAX_PER_RANK, MIN_PER_RANK = 20_000, 2_000
TOTAL_CALLS = 400_000  # the default limit spreads this over the ranks: an export stays a few hundred MB at most
KEEP_RULE = (
    "per rank at most {limit} calls: the {window} before and after its call at the first divergence, "
    "its last {tail}, and of the rest every call whose sequence number in its group is a multiple of "
    "the stride (a power of two, the same on every rank, so kept calls still pair)"
)


@dataclass
class Call:
    ev: dict  # the reader's event (its state may still change while reading goes on)
    channel: str  # align.route's key
    seq: int  # position in the channel on this rank
    ordinal: int  # position among this rank's calls
    divergent: bool = False


@dataclass
class Timeline:
    source: str  # "hctool" | "flight-recorder"
    ranks: list[int]
    groups: dict[str, list[int]]
    calls: dict[int, list[Call]]  # per rank, in the rank's order
    seen: dict[int, int]  # calls read per rank
    stride: int
    limit: int
    headers: dict[int, dict] = field(default_factory=dict)
    end_wall: float | None = None  # where calls that never completed are drawn to

    @property
    def thinned(self) -> bool:
        return any(self.seen[r] > len(self.calls.get(r, ())) for r in self.seen)

    def rule(self) -> str:
        w, t = _shares(self.limit)
        return KEEP_RULE.format(limit=self.limit, window=w, tail=t)


def _shares(limit: int) -> tuple[int, int]:
    """(window on each side, tail): a tenth of the limit each; the rest is for the thinned calls."""
    return max(1, limit // 10), max(1, limit // 10)


class _Keeper:
    def __init__(self, limit: int, divergence: tuple[str, int] | None, groups: dict):
        self.limit, self.divergence, self.groups = limit, divergence, groups
        self.window, tail = _shares(limit)
        self.budget = max(1, limit - 2 * self.window - tail - 1)
        self.stride = 1
        self.ordinal: dict[int, int] = {}
        self.seqs: dict[tuple[int, str], int] = {}
        self.before: dict[int, deque] = {}
        self.after_left: dict[int, int] = {}
        self.kept_window: dict[int, list] = {}
        self.tail: dict[int, deque] = {}
        self.thin: dict[int, list] = {}
        self._tail_len = tail

    def add(self, ev: dict) -> None:
        r = ev["rank"]
        channel = route(ev, self.groups) or f"{ev['g']} p2p {r}->any"
        seq = self.seqs.get((r, channel), 0)
        self.seqs[(r, channel)] = seq + 1
        n = self.ordinal.get(r, 0)
        self.ordinal[r] = n + 1
        call = Call(ev, channel, seq, n, divergent=(channel, seq) == self.divergence)
        window = self.kept_window.setdefault(r, [])
        before = self.before.setdefault(r, deque(maxlen=self.window))
        if call.divergent:
            window.extend(before)
            before.clear()
            window.append(call)
            self.after_left[r] = self.window
        elif self.after_left.get(r, 0) > 0:
            window.append(call)
            self.after_left[r] -= 1
        elif not window:
            before.append(call)
        self.tail.setdefault(r, deque(maxlen=self._tail_len)).append(call)
        if seq % self.stride == 0:
            thin = self.thin.setdefault(r, [])
            thin.append(call)
            if len(thin) > self.budget:
                self.stride *= 2
                for rank, kept in self.thin.items():
                    self.thin[rank] = [c for c in kept if c.seq % self.stride == 0]

    def result(self) -> tuple[dict[int, list[Call]], dict[int, int]]:
        out = {}
        for r in self.ordinal:
            chosen = {c.ordinal: c for c in self.thin.get(r, []) if c.seq % self.stride == 0}
            for c in (*self.kept_window.get(r, []), *self.tail.get(r, [])):
                chosen[c.ordinal] = c
            out[r] = [chosen[k] for k in sorted(chosen)]
        return out, dict(self.ordinal)


def default_limit(world_size: int) -> int:
    """Calls per rank: 20,000 up to 20 ranks, then 400,000 over the ranks, at least 2,000."""
    return max(MIN_PER_RANK, min(MAX_PER_RANK, TOTAL_CALLS // max(1, world_size)))


def collect(path, divergence=None, limit: int | None = None, ended_at: float | None = None) -> Timeline:
    """The calls of a trace folder (or of Flight Recorder dumps) within `limit` per rank.
    limit: calls per rank (None: default_limit of the world size);
    divergence: the report's first divergence (a consensus.model.Divergence: its group and seq), or None;
    ended_at: when the run ended (wall), if the caller knows: calls that never
    completed are drawn until then (else until the last recorded time).
    Raises trace.TraceError for a folder hctool cannot read."""
    path = os.fspath(path)
    key = (divergence.group, divergence.seq) if divergence else None
    if not trace_files(path) and is_flight_recorder_dir(path):
        per_rank, groups = read_flight_recorder(path)
        limit = limit or default_limit(len(per_rank))
        keeper = _Keeper(limit, key, groups)
        for r in sorted(per_rank):
            for ev in per_rank[r]:
                keeper.add(ev)
        calls, seen = keeper.result()
        ranks = sorted(per_rank)
        return Timeline(
            "flight-recorder", ranks, groups, calls, seen, keeper.stride, limit, end_wall=_end(calls, ended_at)
        )
    reader = TraceDirReader(path, strict=True)
    keeper = None
    while True:
        events = reader.poll()
        if keeper is None:  # the first poll has read the headers: the world size is known
            limit = limit or default_limit(reader.world_size or len(reader.ranks))
            keeper = _Keeper(limit, key, reader.groups)  # the reader fills in groups as it reads
        for ev in events:
            keeper.add(ev)
        if not reader.more:
            break
    calls, seen = keeper.result()
    ranks = sorted(set(calls) | set(range(reader.world_size or 0)))
    headers = {r: rt.header for r, rt in reader.ranks.items()}
    return Timeline(
        "hctool", ranks, dict(reader.groups), calls, seen, keeper.stride, limit, headers, end_wall=_end(calls, ended_at)
    )


def wall_end(ev: dict, end: float | None) -> float:
    """Where a call's slice ends: its completion; `end` (the run's) if it never completed;
    its start if it completed at a time nobody recorded (Flight Recorder dumps of gloo)."""
    done = wall_done(ev)
    if done is not None and ev.get("state") != "blocked":
        return max(done, ev["w"])
    return ev["w"] if ev.get("state") == "completed" or end is None else max(end, ev["w"])


def wall_done(ev: dict) -> float | None:
    """The wall time a call completed (or failed) at; None while it never did."""
    if ev.get("t_done") is None or ev.get("w") is None or ev.get("t") is None:
        return None
    return ev["w"] + (ev["t_done"] - ev["t"])


def _last_time(calls: dict[int, list[Call]]) -> float | None:
    times = [t for cs in calls.values() for c in cs for t in (c.ev.get("w"), wall_done(c.ev)) if t is not None]
    return max(times) if times else None


def _end(calls: dict[int, list[Call]], ended_at: float | None) -> float | None:
    last = _last_time(calls)
    if ended_at is None or last is None:
        return last
    # a run record written long after the last call (copied folders get new times) says nothing
    return ended_at if last <= ended_at <= last + MAX_TAIL_S else last
