"""A run as Chrome Trace Event Format JSON (Perfetto, chrome://tracing, HTA).

The contract (docs/contracts.md "check-consensus export"):
  - one process per rank (pid = rank + 1, named "rank R" by a process_name
    metadata event, sorted by rank); in it one thread track per process group
    ("group <key>"), one for labelled values ("labels") and one for marks
    ("events": faults, controller actions, probes); a track whose calls
    overlap in time (async calls, several threads) gets extra lanes
    ("group <key> #2"), so slices on one track always nest; every track's tid
    is unique in the file (no tid in two processes, none equal to a pid);
  - a complete event (ph "X", ts and dur in microseconds from the run's first
    call) per collective from enqueue to completion, args: op, group, seq,
    shapes, dtypes, reduce_op, root or peer, site, function, stack, thread,
    state (a call that never completed lasts until the run ended);
  - flow events (ph "s" then "f", same id, cat "pair") from each rank's call
    to the call with the same group and seq that entered next: the calls the
    transport paired; named "paired" or "paired, mismatched: <kind>";
  - the first divergence: an instant (ph "i") named "first divergence: ..."
    on the track of every rank it involves (an absent rank's at the time of
    the finding), and the divergent slice's args.first_divergence;
  - labelled values and marks as instant events, fault windows as slices;
  - otherData.hctool: verdict, source, the limit and the rule that kept it.
"""

from __future__ import annotations

from dataclasses import replace

from hctool.consensus.align import pair_label
from hctool.consensus.marks import Mark
from hctool.consensus.model import Divergence, Report
from hctool.consensus.timeline import Call, Timeline, wall_end
from hctool.console.paths import short_frame

FORMAT = "hctool-chrome-trace/1"
MAX_NAMED = 12  # runs named in the line that says which run of a folder was exported
MIN_DUR_US = 1.0  # a call that took no measurable time still shows (and can hold a flow)
# A flow event sits this far inside its call's slice, not on its first microsecond: a viewer binds
# it to the slice around its ts, and whether a slice "is around" its own start, or is read before
# an event of the same ts, differs between viewers. The same inset on both ends keeps the order.
FLOW_INSET_US = MIN_DUR_US / 2


def _us(t: float, t0: float) -> float:
    return round((t - t0) * 1e6, 3)


def _group_order(key: str) -> tuple:
    head = key.split(":", 1)[0]
    return (0, int(head), key) if head.isdigit() else (1, 0, key)


class _Tracks:
    """The rank's own tids (_global_tids makes them unique in the file): "events" 1, "labels" 2,
    then per group track the lanes it needed."""

    def __init__(self):
        self.names: dict[int, str] = {1: "events", 2: "labels"}
        self.lanes: dict[str, list[tuple[int, float]]] = {
            "events": [(1, float("-inf"))],
            "labels": [(2, float("-inf"))],
        }
        self.order: dict[int, tuple] = {1: (-2,), 2: (-1,)}
        self._next = 3

    def lane(self, track: str, start: float, end: float, sort) -> int:
        lanes = self.lanes.setdefault(track, [])
        for i, (tid, busy_until) in enumerate(lanes):
            if start >= busy_until:
                lanes[i] = (tid, end)
                return tid
        tid, self._next = self._next, self._next + 1
        lanes.append((tid, end))
        self.names[tid] = track if len(lanes) == 1 else f"{track} #{len(lanes)}"
        self.order[tid] = (*sort, len(lanes))
        return tid

    def first(self, track: str, sort) -> int:
        lanes = self.lanes.get(track)
        return lanes[0][0] if lanes else self.lane(track, float("inf"), float("inf"), sort)


def _call_args(c: Call, divergence: Divergence | None) -> dict:
    ev = c.ev
    args = {
        "op": ev["op"],
        "group": ev["g"],
        "seq": c.seq,
        "shapes": ev.get("sh", []),
        "dtypes": ev.get("dt", []),
        "site": ev.get("site"),
        "function": ev.get("fn"),
        "thread": ev.get("th"),
        "state": ev.get("state"),
    }
    if c.divergent or ev.get("state") != "completed":  # the stack where it matters; elsewhere it would triple the file
        # frames as the reader opens them: relative to the working directory (hctool.console.paths)
        args["stack"] = [short_frame(f) if isinstance(f, str) else f for f in ev.get("stack") or []]
    if ev.get("ro"):
        args["reduce_op"] = ev["ro"]
    if "dir" in ev:
        args["peer"] = ev.get("peer")
        args["direction"] = ev["dir"]
    elif ev.get("root") is not None:
        args["root"] = ev["root"]
    if ev.get("async"):
        args["async"] = True
    if ev.get("err"):
        args["error"] = ev["err"]
    if c.divergent and divergence:
        args["first_divergence"] = {"kind": divergence.kind.value, "culprit_ranks": divergence.culprit_ranks}
    return args


def _marker_name(divergence: Divergence, rank: int) -> str:
    role = "culprit" if rank in divergence.culprit_ranks else "peer"
    entry = divergence.ranks.get(rank)
    what = (entry.op if entry is not None else None) or "absent"
    return f"first divergence: {divergence.kind.value}, {what} ({role})"


def to_chrome(tl: Timeline, report: Report, marks: list[Mark] = ()) -> dict:
    divergence = report.first_divergence
    starts = [c.ev["w"] for cs in tl.calls.values() for c in cs if c.ev.get("w") is not None]
    starts += [m.ts for m in marks]
    t0 = min(starts) if starts else 0.0
    end = max(filter(None, [tl.end_wall, *(m.ts + (m.dur or 0) for m in marks)]), default=t0)
    events: list[dict] = []
    tracks: dict[int, _Tracks] = {}
    placed: dict[tuple[str, int], list[tuple[int, int, float, Call]]] = {}  # (channel, seq) -> [(rank, tid, ts, call)]
    for r in tl.ranks:
        tr = tracks[r] = _Tracks()
        pid = r + 1
        for c in tl.calls.get(r, []):
            ev = c.ev
            if ev.get("w") is None:
                continue
            ts = _us(ev["w"], t0)
            if ev["g"] == "labels":
                events.append(
                    {
                        "ph": "i",
                        "s": "t",
                        "name": f"{ev.get('label')}",
                        "cat": "label",
                        "pid": pid,
                        "tid": 2,
                        "ts": ts,
                        "args": {
                            **_call_args(c, divergence),
                            "label": ev.get("label"),
                            "digest": ev.get("digest"),
                            "value": ev.get("value"),
                        },
                    }
                )
                if c.divergent:
                    events.append(_marker(divergence, r, pid, 2, ts))
                continue
            dur = max(MIN_DUR_US, _us(wall_end(ev, end), t0) - ts)
            track = f"group {ev['g']}"
            tid = tr.lane(track, ts, ts + dur, _group_order(ev["g"]))
            slice_ = {
                "ph": "X",
                "name": ev["op"],
                "cat": "p2p" if "dir" in ev else "collective",
                "pid": pid,
                "tid": tid,
                "ts": ts,
                "dur": round(dur, 3),
                "args": _call_args(c, divergence),
            }
            if c.divergent:
                slice_["cname"] = "terrible"
                events.append(_marker(divergence, r, pid, tid, ts))
            elif ev.get("state") != "completed":
                slice_["cname"] = "bad"
            events.append(slice_)
            placed.setdefault((c.channel, c.seq), []).append((r, tid, ts, c))
    if divergence:
        events += _absent_markers(tl, divergence, tracks, report, t0)
    events += _flows(placed)
    events += _marks(marks, tl.ranks, tracks, t0, end)
    tids = _global_tids(tl.ranks, tracks, {(e["pid"], e["tid"]) for e in events})
    for e in events:
        e["tid"] = tids.get((e["pid"], e["tid"]), e["tid"])
    meta = _metadata(tl.ranks, tracks, tids)
    if tl.thinned:
        meta.append(
            {
                "ph": "i",
                "s": "g",
                "name": "hctool: calls thinned to fit the limit",
                "pid": 0,
                "tid": 0,
                "ts": 0,
                "args": {"rule": tl.rule(), "stride": tl.stride},
            }
        )
    events.sort(key=lambda e: e["ts"])
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "hctool": {
                "format": FORMAT,
                "source": tl.source,
                "verdict": report.verdict.value,
                "cause": divergence.cause_line() if divergence else None,
                "first_divergence": _brief(divergence),
                "t0_wall": t0,
                "limit_per_rank": tl.limit,
                "rule": tl.rule(),
                "stride": tl.stride,
                "calls_seen": {str(r): n for r, n in sorted(tl.seen.items())},
                "calls_kept": {str(r): len(cs) for r, cs in sorted(tl.calls.items())},
            }
        },
    }


def _brief(divergence: Divergence | None) -> dict | None:
    if not divergence:
        return None
    return {
        "group": divergence.group,
        "seq": divergence.seq,
        "kind": divergence.kind.value,
        "culprit_ranks": divergence.culprit_ranks,
    }


def _marker(divergence: Divergence, rank: int, pid: int, tid: int, ts: float) -> dict:
    entry = divergence.ranks.get(rank)
    return {
        "ph": "i",
        "s": "t",
        "name": _marker_name(divergence, rank),
        "cat": "divergence",
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "args": {**_brief(divergence), "rank": rank, "site": entry.site if entry is not None else None},
    }


def _absent_markers(tl: Timeline, divergence: Divergence, tracks: dict, report: Report, t0: float) -> list[dict]:
    """Ranks the finding names that have no call at it: a marker at the time of the finding."""
    have = {r for r, cs in tl.calls.items() for c in cs if c.divergent}
    times = [c.ev["w"] for cs in tl.calls.values() for c in cs if c.divergent and c.ev.get("w") is not None]
    at = _us(min(times), t0) if times else 0.0
    group = divergence.group.split(" p2p ", 1)[0]
    out = []
    for r in divergence.ranks:
        if r in have or r not in tracks:
            continue
        tid = 2 if group == "labels" else tracks[r].first(f"group {group}", _group_order(group))
        out.append(_marker(divergence, r, r + 1, tid, at))
    return out


def _flows(placed: dict) -> list[dict]:
    out, fid = [], 0
    for key in sorted(placed, key=lambda k: (k[0], k[1])):
        # by entry time, so every arrow starts before it ends: Perfetto's JSON importer sorts by
        # time and drops a flow end whose start it has not seen (it always started on rank 0)
        sides = sorted(placed[key], key=lambda x: (x[2], x[0]))
        for (ra, ta, tsa, ca), (rb, tb, tsb, cb) in zip(sides, sides[1:]):
            fid += 1
            _, name = pair_label(ca.ev, cb.ev)
            tsa, tsb = round(tsa + FLOW_INSET_US, 3), round(tsb + FLOW_INSET_US, 3)
            out.append({"ph": "s", "id": fid, "name": name, "cat": "pair", "pid": ra + 1, "tid": ta, "ts": tsa})
            out.append(
                {"ph": "f", "bp": "e", "id": fid, "name": name, "cat": "pair", "pid": rb + 1, "tid": tb, "ts": tsb}
            )
    return out


def _marks(marks, ranks: list[int], tracks: dict, t0: float, end: float) -> list[dict]:
    out = []
    for m in marks:
        ts = _us(m.ts, t0)
        if m.until_end:
            m = replace(m, dur=max(0.0, end - m.ts))
        args = {**m.args, "kind": m.kind}
        if m.dur is None and m.rank is None:
            out.append({"ph": "i", "s": "g", "name": m.name, "cat": m.kind, "pid": 0, "tid": 0, "ts": ts, "args": args})
            continue
        for r in [m.rank] if m.rank is not None else ranks:
            if r not in tracks:
                continue
            if m.dur is None:
                out.append(
                    {"ph": "i", "s": "t", "name": m.name, "cat": m.kind, "pid": r + 1, "tid": 1, "ts": ts, "args": args}
                )
            else:
                # rounded before its lane is chosen: the slice drawn is the one that must fit. A
                # window of no length (a fault switched on as the run ended) still takes a lane:
                # on the first one it overlapped a window ending a rounding later, not nesting
                dur = round(max(MIN_DUR_US, m.dur * 1e6), 3)
                tid = tracks[r].lane("events", ts, ts + dur, (-2,))
                out.append(
                    {
                        "ph": "X",
                        "name": m.name,
                        "cat": m.kind,
                        "pid": r + 1,
                        "tid": tid,
                        "ts": ts,
                        "dur": dur,
                        "args": args,
                    }
                )
    return out


def _global_tids(ranks: list[int], tracks: dict, used: set) -> dict[tuple[int, int], int]:
    """(pid, the rank's own tid) -> a tid no other process uses. Viewers key threads by tid:
    Perfetto's JSON importer took rank 1's "events" (tid 1 in every rank) for a thread that
    moved from rank 0. They start above every pid, so no track reads as a process's main thread."""
    out, nxt = {}, max(ranks, default=-1) + 2
    for r in ranks:
        pid, tr = r + 1, tracks[r]
        for tid in sorted((t for t in tr.names if (pid, t) in used), key=lambda t: tr.order[t]):
            out[(pid, tid)], nxt = nxt, nxt + 1
    return out


def _metadata(ranks: list[int], tracks: dict, tids: dict[tuple[int, int], int]) -> list[dict]:
    out = []
    for r in ranks:
        pid = r + 1
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": f"rank {r}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0, "args": {"sort_index": r}})
        tr = tracks[r]
        mine = sorted((t for t in tr.names if (pid, t) in tids), key=lambda t: tr.order[t])
        for i, local in enumerate(mine):
            tid = tids[(pid, local)]
            name = tr.names[local]
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}})
            out.append(
                {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "ts": 0, "args": {"sort_index": i}}
            )
    return out


def export_folder(path, run: str | None = None, limit: int | None = None, marks: list[Mark] | None = None):
    """(Chrome trace document, the TracedRun it shows) for a run folder of any runner.
    A folder of several runs (repro, chaos) gives one of them: `run`, else the first that is not
    clean; which one, and why, is in otherData.hctool.run/run_choice and on stderr.
    marks: more instant events to draw (a probe's entries, a fault's firings) beside
    what the folder's records give. Raises folders.FolderError or trace.TraceError."""
    from hctool.consensus.marks import run_marks
    from hctool.consensus.timeline import collect
    from hctool.console import log
    from hctool.report.folders import analysis, ended_at, identify, interesting, pick, traced_runs

    folder = identify(path)
    chosen = pick(folder, run)
    runs = traced_runs(folder)
    choice = _choice(runs, chosen, run, interesting)
    if choice:
        log.info(f"hctool: {folder.kind} folder {folder.path}: {choice}")
    report = analysis(chosen)
    tl = collect(chosen.trace_dir, report.first_divergence, limit, ended_at(chosen))
    doc = to_chrome(tl, report, [*run_marks(chosen.run_dir, tl.headers), *(marks or [])])
    doc["otherData"]["hctool"]["run"] = chosen.name
    doc["otherData"]["hctool"]["run_choice"] = choice
    return doc, chosen


def _choice(runs: list, chosen, asked: str | None, interesting) -> str | None:
    """Which of several runs the export shows and why, as a sentence (None: the folder is one run).
    A file draws one run; a chaos folder's other failing runs are named so each can be exported."""
    if len(runs) < 2:
        return None
    bad = [r.name for r in runs if interesting(r)]
    if asked is not None:
        why = "as --run asked"
    elif bad:
        more = bad[1 : MAX_NAMED + 1]
        why = "the first that is not clean" + (f"; also not clean: {', '.join(more)}" if more else "")
        why += f" and {len(bad) - 1 - len(more)} more" if len(bad) - 1 > len(more) else ""
    else:
        why = "every run is clean: the first"
    names = ", ".join(r.name for r in runs[:MAX_NAMED]) + (
        f" and {len(runs) - MAX_NAMED} more" if len(runs) > MAX_NAMED else ""
    )
    return f"exporting run {chosen.name} of {len(runs)} ({why}); --run NAME exports another of: {names}"
