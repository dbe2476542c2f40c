"""Reading PyTorch Flight Recorder dumps (pickles) as a second trace format, at scale.

A pickle can run code when loaded, and dump folders come from other people, so the unpickler
here resolves no global at all: only plain containers and scalars load (what torch writes),
anything else is a TraceError naming the file. Files must be regular and at most MAX_DUMP_BYTES.

A job of a thousand ranks leaves a thousand dumps of up to 2,000 entries each, every entry with
its stack frames. Each dump is read on its own (in worker processes where there are several
cores) into a compact form: per process group, one small id per entry (the kind of call: op,
sizes, dtypes, the user's frame) plus its sequence id, time and state, and one template event
per distinct kind. Only these travel and stay in memory, never a rank's frames.

What a dump says, and how it is read:
- `pg_config` names each group's ranks (NCCL); gloo's is empty in torch 2.13: a group's members
  are then the ranks whose dumps name it.
- `collective_seq_id` orders a group's collectives, `p2p_seq_id` its p2p ops; consecutive
  entries of one group sharing a sequence id and ending in a `coalesced` entry are one call
  (coalesced collectives, batch_isend_irecv).
- p2p entries name their peer in the group's ranks ("nccl:send 1->2", "nccl:recv 2<-1"): a
  send and its receive meet in the flow src->dst, as hctool's own traces.
- A dump is a ring buffer: ranks' buffers may start at different points. Per group, calls
  before the latest first sequence id over its ranks are set aside (only what every rank
  still holds is compared).
- `state`: NCCL's scheduled/started/completed; gloo's entries stay "scheduled" (no state is
  tracked): a dump with no completed entry counts every entry as completed.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import stat
from dataclasses import dataclass, field

from hctool.consensus.trace import TraceError, open_regular

MAX_DUMP_BYTES = 256 << 20
_SKIP = (".jsonl", ".ring", ".stack", ".log", ".json", ".html", ".lock", ".txt", ".toml", ".py")
_P2P = re.compile(r"^(send|recv) (\d+)(->|<-)(\d+)$")
_LIBRARY = ("/torch/", "/hctool/", "<frozen", "/threading.py")


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise TraceError(f"refusing to load {module}.{name}: Flight Recorder dumps hold only plain data")


def load_dump(path: str) -> dict | None:
    """The dump at `path`; None if it is not a pickle of a dict with entries."""
    fd = open_regular(path, MAX_DUMP_BYTES)
    with os.fdopen(fd, "rb") as f:
        if f.read(1) != b"\x80":  # pickle protocol 2+ marker
            return None
        f.seek(0)
        data = f.read()
    try:
        obj = _PlainUnpickler(io.BytesIO(data)).load()
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None
    except Exception as exc:
        raise TraceError(f"{path}: not a readable pickle ({type(exc).__name__})") from None
    return obj if isinstance(obj, dict) and isinstance(obj.get("entries"), list) else None


def _candidates(path: str) -> list[str]:
    return [os.path.join(path, n) for n in sorted(os.listdir(path)) if not n.endswith(_SKIP)]


def is_flight_recorder_dir(path: str) -> bool:
    for full in _candidates(path)[:64]:
        if os.path.isfile(full) and not os.path.islink(full):
            with open(full, "rb") as f:
                if f.read(1) == b"\x80":
                    return True
    return False


@dataclass
class DumpCalls:
    """One rank's dump, compact: per group, its calls as small ids; one template event per kind."""

    rank: int
    path: str
    groups: dict[str, dict] = field(default_factory=dict)  # key -> {"ranks": [int] | None, "desc": str}
    calls: dict[str, list] = field(default_factory=dict)  # key -> [(kind, seq, t, completed)] in order
    p2p: list = field(default_factory=list)  # [(group key, kind, seq, t, completed)]
    kinds: list[dict] = field(default_factory=list)  # kind -> template event (no rank, time, state)
    last_frames: list[str] = field(default_factory=list)  # the frames of its last entry, innermost first
    entries: int = 0

    def compact(self) -> None:
        """The call lists as arrays (kind, seq, time, completed): what travels back from a worker."""
        import numpy as np

        def cols(rows):
            return (
                np.array([r[0] for r in rows], dtype=np.int32),
                np.array([r[1] for r in rows], dtype=np.int64),
                np.array([r[2] for r in rows], dtype=np.float64),
                np.array([r[3] for r in rows], dtype=bool),
            )

        self.calls = {g: cols(rows) for g, rows in self.calls.items()}
        groups = sorted({p[0] for p in self.p2p})
        index = {g: i for i, g in enumerate(groups)}
        self.p2p = (groups, np.array([index[p[0]] for p in self.p2p], dtype=np.int32), *cols([p[1:] for p in self.p2p]))

    def p2p_rows(self):
        """(group, kind, seq, time, completed) per p2p op, in order."""
        groups, gi, kinds, seqs, ts, done = self.p2p
        return [
            (groups[g], k, q, t, c)
            for g, k, q, t, c in zip(gi.tolist(), kinds.tolist(), seqs.tolist(), ts.tolist(), done.tolist())
        ]


def _ranks(text) -> list[int] | None:
    try:
        got = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return None
    if isinstance(got, list) and got and all(isinstance(r, int) and 0 <= r < (1 << 16) for r in got):
        return got
    return None


def _user_frames(frames) -> list[dict]:
    out = [f for f in frames if isinstance(f, dict) and not any(s in str(f.get("filename", "")) for s in _LIBRARY)]
    return out or [f for f in frames if isinstance(f, dict)][:1]


def read_dump(path: str) -> DumpCalls | None:
    """One dump into its compact form (a worker process may run this); None: not a dump."""
    data = load_dump(path)
    if data is None:
        return None
    m = re.search(r"(\d+)$", os.path.basename(path))
    rank = data.get("rank", int(m.group(1)) if m else None)
    if not isinstance(rank, int) or not 0 <= rank < (1 << 16):
        raise TraceError(f"{path}: rank {rank!r} is not a rank (name the dumps <prefix><rank>)")
    out = DumpCalls(rank, path)
    config = data.get("pg_config") if isinstance(data.get("pg_config"), dict) else {}
    try:
        entries = sorted((e for e in data["entries"] if isinstance(e, dict)), key=lambda e: int(e.get("record_id", 0)))
        tracked = any(e.get("state") == "completed" for e in entries)
        kinds: dict[str, int] = {}
        pending: list = []  # a coalesced group being read: its member entries
        for e in entries:
            pg = e.get("process_group") or ("", "")
            gkey = f"fr{e.get('pg_id', pg[0] if pg else '?')}"
            if gkey not in out.groups:
                conf = config.get(str(pg[0])) or config.get(pg[0]) or {}
                out.groups[gkey] = {
                    "ranks": _ranks(conf.get("ranks")) if isinstance(conf, dict) else None,
                    "desc": str(pg[1]) if len(pg) > 1 else "",
                }
            name = str(e.get("profiling_name", "")).split(":", 1)[-1]
            is_p2p = bool(e.get("is_p2p"))
            seq = int(e.get("p2p_seq_id") if is_p2p else e.get("collective_seq_id") or 0)
            if pending and (pending[0][0] != gkey or pending[0][2] != seq or pending[0][3] != is_p2p):
                _flush(out, pending, kinds, tracked)
            pending.append((gkey, e, seq, is_p2p, name))
            if name == "coalesced":  # the end of a coalesced group
                _flush(out, pending, kinds, tracked)
        _flush(out, pending, kinds, tracked)
        out.entries = len(entries)
        out.compact()
        if entries:
            out.last_frames = [
                f"{f.get('name')} ({os.path.basename(str(f.get('filename')))}:{f.get('line')})"
                for f in _user_frames(entries[-1].get("frames") or [])
            ]
        json.dumps(out.kinds)  # plain data only, or the aligner would trip on it later
    except (TypeError, ValueError, AttributeError, RecursionError, KeyError) as exc:
        raise TraceError(f"{path}: not a Flight Recorder dump ({exc})") from None
    return out


def _flush(out: DumpCalls, pending: list, kinds: dict, tracked: bool) -> None:
    """The entries read so far as one call (a coalesced group: one call of all its members), or
    as p2p operations (each a flow's call)."""
    if not pending:
        return
    members = [p for p in pending if p[4] != "coalesced"] or pending
    gkey, first, seq, is_p2p = pending[0][0], pending[0][1], pending[0][2], pending[0][3]
    last = pending[-1][1]
    t = (first.get("time_created_ns") or 0) / 1e9
    completed = not tracked or last.get("state") == "completed"
    if is_p2p:
        for _, e, _, _, name in members:
            m = _P2P.match(name)
            if m is None:
                continue
            op, a, arrow, b = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
            src, dst = (a, b) if arrow == "->" else (b, a)
            k = _kind(
                out,
                kinds,
                (name, _sizes(e)),
                lambda: _template(op, e, extra={"dir": "send" if op == "send" else "recv", "src": src, "dst": dst}),  # noqa: B023  (called here, inside _kind, before the loop moves on)
                e,
            )
            out.p2p.append((gkey, k, seq, t, completed))
        pending.clear()
        return
    if len(members) == 1:
        name = members[0][4]
        k = _kind(
            out,
            kinds,
            (name, _sizes(members[0][1])),
            lambda: _template(name.split(" ", 1)[0], members[0][1]),
            members[0][1],
        )
    else:  # coalesced: one call of every member, in order

        def make() -> dict:
            ev = _template("coalesced", members[0][1])
            ev["sh"] = [list(s) for _, e, _, _, _ in members for s in e.get("input_sizes") or []]
            ev["dt"] = [str(d) for _, e, _, _, _ in members for d in e.get("input_dtypes") or []]
            ev["op"] = "coalesced:" + ",".join(p[4].split(" ", 1)[0] for p in members)
            return ev

        k = _kind(out, kinds, tuple((p[4], _sizes(p[1])) for p in members), make, members[0][1])
    out.calls.setdefault(gkey, []).append((k, seq, t, completed))
    pending.clear()


def _sizes(e: dict) -> tuple:
    return (repr(e.get("input_sizes")), repr(e.get("input_dtypes")))


def _template(op: str, e: dict, extra: dict | None = None) -> dict:
    frames = _user_frames(e.get("frames") or [])
    top = frames[0] if frames else {}
    op = op.replace("allreduce", "all_reduce").replace("allgather", "all_gather")
    ev = {
        "op": op,
        "sh": [list(s) for s in e.get("input_sizes") or []],
        "dt": [str(d).replace("torch.", "") for d in e.get("input_dtypes") or []],
        "ro": None,
        "root": None,
        "label": None,
        "digest": None,
        "value": None,
        "site": f"{os.path.basename(str(top.get('filename', '?')))}:{top.get('line', 0)}" if top else None,
        "fn": top.get("name"),
        "stack": [f"{f.get('filename')}:{f.get('line')} {f.get('name')}" for f in frames[:8]],
        "th": e.get("thread_name"),
        "async": False,
    }
    if extra:
        ev.update(extra)
    return ev


def _kind(out: DumpCalls, kinds: dict, what: tuple, make, e: dict) -> int:
    """The kind id of a call: what it is (op, sizes) and where it comes from (its frames), made
    into a template event once per kind. Frames are keyed by identity first (a dump shares them
    where torch did), then by content."""
    frames = e.get("frames") or []
    fk = kinds.get(("frames-id", id(frames)))
    if fk is None or fk[0] is not frames:
        fk = (frames, tuple((f.get("filename"), f.get("line"), f.get("name")) for f in frames if isinstance(f, dict)))
        kinds[("frames-id", id(frames))] = fk
    key = (what, fk[1])
    k = kinds.get(key)
    if k is None:
        k = kinds[key] = len(out.kinds)
        out.kinds.append(make())
    return k


def dump_files(path: str) -> list[str]:
    return [full for full in _candidates(path) if not stat.S_ISDIR(os.lstat(full).st_mode)]


def read_all(path: str, jobs: int | None = None) -> list[DumpCalls]:
    """Every dump in a folder, in worker processes where there are several cores and dumps."""
    files = dump_files(path)
    jobs = jobs if jobs is not None else min(len(files) // 8, os.cpu_count() or 1)
    if jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            got = list(pool.map(read_dump, files, chunksize=max(1, len(files) // (jobs * 8))))
    else:
        got = [read_dump(f) for f in files]
    dumps = [d for d in got if d is not None]
    seen: dict[int, str] = {}
    for d in dumps:
        if d.rank in seen:
            raise TraceError(f"{d.path}: rank {d.rank} has a second dump ({seen[d.rank]})")
        seen[d.rank] = d.path
    return dumps


@dataclass
class Plan:
    """What the analysis takes from a folder of dumps: each group's members and the sequence id
    from which every member still holds its calls."""

    dumps: list[DumpCalls]
    members: dict[str, list[int]]
    start: dict[str, int]
    p2p_start: dict[str, int]  # per group: the p2p sequence id from which every member holds its p2p ops
    expected: list[int]  # ranks the groups name (or that have dumps)
    missing: list[int]  # expected ranks without a dump


def plan(dumps: list[DumpCalls]) -> Plan:
    have = {d.rank for d in dumps}
    members: dict[str, set[int]] = {}
    named: dict[str, list[int]] = {}
    for d in dumps:
        for g, info in d.groups.items():
            members.setdefault(g, set()).add(d.rank)
            if info.get("ranks") and g not in named:
                named[g] = sorted(info["ranks"])
    groups = {g: named.get(g, sorted(rs)) for g, rs in members.items()}
    start = {}
    for g in groups:
        firsts = [int(calls[1][0]) for d in dumps if (calls := d.calls.get(g)) is not None and len(calls[1])]
        start[g] = max(firsts) if firsts else 0
    p2p_start: dict[str, int] = {}
    for d in dumps:
        first: dict[str, int] = {}
        for g, _k, seq, _t, _done in d.p2p_rows():
            first.setdefault(g, seq)
        for g, seq in first.items():
            p2p_start[g] = max(p2p_start.get(g, 0), seq)
    expected = sorted(set().union(*groups.values()) | have) if groups else sorted(have)
    return Plan(dumps, groups, start, p2p_start, expected, sorted(set(expected) - have))


def events_of(d: DumpCalls, p: Plan) -> dict[str, list[dict]]:
    """A dump's calls as event dicts, per group (from each group's common start): for pages and
    the export (the analysis itself folds columns, analyze.py)."""
    out: dict[str, list[dict]] = {}
    for g, (kinds, seqs, ts, done) in d.calls.items():
        out[g] = [
            event(d, g, k, t, c)
            for k, q, t, c in zip(kinds.tolist(), seqs.tolist(), ts.tolist(), done.tolist())
            if q >= p.start.get(g, 0)
        ]
    return out


def event(d: DumpCalls, g: str, kind: int, t: float, completed: bool) -> dict:
    return dict(d.kinds[kind], rank=d.rank, g=g, t=t, w=t, state="completed" if completed else "blocked")


def p2p_event(d: DumpCalls, p: Plan, g: str, kind: int, t: float, completed: bool) -> dict | None:
    """A p2p op, its peer as a global rank (the group's ranks name it by its index)."""
    ev = dict(d.kinds[kind])
    ranks = p.members.get(g) or []
    src, dst = ev.pop("src", None), ev.pop("dst", None)
    if src is None or dst is None or not (0 <= src < len(ranks) and 0 <= dst < len(ranks)):
        return None
    peer = ranks[dst] if ev["dir"] == "send" else ranks[src]
    return dict(ev, rank=d.rank, g=g, peer=peer, t=t, w=t, state="completed" if completed else "blocked")


def read_flight_recorder(path: str) -> tuple[dict[int, list[dict]], dict[str, list[int]]]:
    """Every dump's calls as events per rank, and each group's members (pages and the export)."""
    dumps = read_all(path)
    p = plan(dumps)
    per_rank: dict[int, list[dict]] = {}
    for d in dumps:
        evs = [ev for calls in events_of(d, p).values() for ev in calls]
        evs += [
            e
            for g, k, seq, t, done in d.p2p_rows()
            if seq >= p.p2p_start.get(g, 0) and (e := p2p_event(d, p, g, k, t, done)) is not None
        ]
        per_rank[d.rank] = sorted(evs, key=lambda e: e["t"])
    return per_rank, p.members
