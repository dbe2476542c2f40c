"""Reading hctool traces (records.py format) incrementally, for live mode and
for `analyze`. Each rank's calls become Event dicts with a `state` of
"blocked" (entered, not completed), "completed" or "failed".

Trace folders may come from someone else: with strict=True (analyze) only
regular files are read (never a FIFO or a symlink), files and lines are size
limited, every record is type-checked, and anything malformed is a TraceError
naming the file and line. Live mode (strict=False) skips what it cannot read.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field

import numpy as np

from hctool.consensus.columns import RECORD_DTYPE
from hctool.console import log
from hctool.protocol.records import (
    CALL,
    FLAG_ASYNC,
    INTERNED,
    KIND_CALL,
    KIND_EMPTY,
    KIND_VOID,
    NO_ROOT,
    RECORD_SIZE,
    STATE_COMPLETED,
    STATE_ENTERED,
    STATE_FAILED,
    CallRecord,
    Event,
    Site,
)
from hctool.supervise import runlock

TRACE_NAME = re.compile(r"^rank(\d{1,6}|X)-(\d{1,10})\.jsonl$")
MAX_WORLD = 1 << 16
# Limits for folders from elsewhere (strict); reading goes in rounds, so these
# bound time, not memory. Live mode reads its own job's files without limits.
MAX_SIDE_BYTES = 1 << 30  # one side table
MAX_RING_BYTES = 16 << 30  # one ring file (256 M calls)
MAX_LINE = 1 << 20
MAX_INTERNED = 1 << 20  # values of one kind in one side table (real traces: thousands)
MAX_PROBES = 200_000  # probe entries kept per rank process (counted beyond that)
SIDE_CHUNK = 4 << 20  # read per file per poll: ranks advance together, the agreed prefix is dropped
RING_CHUNK = 1 << 16  # records per file per poll
P2P_DIR = {
    "send": "send",
    "isend": "send",
    "send_object_list": "send",
    "recv": "recv",
    "irecv": "recv",
    "recv_object_list": "recv",
}
_NO_SITE = Site(None, None, ())
_SAID: set = set()  # foreign trace files already named on stderr by this process
_STATE = {STATE_ENTERED: "blocked", STATE_COMPLETED: "completed", STATE_FAILED: "failed"}


class TraceError(ValueError):
    """A trace file that is not what hctool writes (one line, names the file)."""


def open_regular(path: str, limit: int | None) -> int:
    """An fd of `path` if it is a regular file of at most `limit` bytes (None: any
    size; never a FIFO, device or symlink: O_NOFOLLOW and O_NONBLOCK, then fstat)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read as a regular file ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (limit is not None and st.st_size > limit):
        os.close(fd)
        why = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"larger than {limit >> 20} MiB"
        raise TraceError(f"{path}: {why}")
    return fd


@dataclass
class RankTrace:
    rank: int
    pid: int
    header: dict = field(default_factory=dict)
    ended: str | None = None  # None: no end record; "clean" or "crashed"
    end_error: str | None = None
    end_t: float | None = None  # monotonic time of the end record
    last_event: dict | None = None
    probes: list = field(default_factory=list)  # (t, name, caller site, caller function), in order
    probe_counts: dict = field(default_factory=dict)  # name -> entries recorded
    truncated: dict | None = None  # the recorder stopped (its folder was full): {"why", "slot"}


@dataclass
class _File:
    name: str
    rt: RankTrace
    side_off: int = 0
    partial: bytes = b""
    line_no: int = 0
    next_slot: int = 0
    wall_offset: float = 0.0  # wall = monotonic + this
    tables: dict = field(default_factory=lambda: {k: {} for k in INTERNED})
    groups: dict = field(default_factory=dict)  # ring group id -> key
    errors: dict = field(default_factory=dict)  # token -> error text
    open: dict = field(default_factory=dict)  # ring slot -> [events]
    cols: object = None  # columns.FileColumns, in column mode


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(what)


def _is_int(x, lo: int = 0, hi: int = 1 << 62) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x < hi


def _strs(x) -> bool:
    return isinstance(x, list) and all(isinstance(s, str) for s in x)


def trace_files(path: str) -> list[str]:
    """Trace file names in a folder and in its subfolders one level down (one per
    host when traces were gathered from several hosts), relative to it."""
    try:
        top = sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = [n for n in top if TRACE_NAME.match(n)]
    for sub in top:
        full = os.path.join(path, sub)
        if not os.path.isdir(full) or os.path.islink(full):
            continue
        try:
            out += [os.path.join(sub, n) for n in sorted(os.listdir(full)) if TRACE_NAME.match(n)]
        except OSError:
            continue
    return out


class TraceDirReader:
    """Reads what was appended to every rank{R}-{pid} trace in a folder since the
    previous poll(); `more` says a per-poll cap left data for the next one."""

    def __init__(self, path: str, strict: bool = False, interner=None):
        self.path = path
        self.strict = strict
        # With an Interner (consensus/columns.py), poll() leaves completed non-p2p calls of the
        # ring files as column blocks in `blocks` (rank, channel, Block) instead of event dicts.
        self.interner = interner
        self.blocks: list = []
        self.ranks: dict[int, RankTrace] = {}  # newest process per rank
        self.groups: dict[str, list[int]] = {}
        self.world_size: int | None = None
        self.more = False
        self._files: dict[str, _File] = {}
        self.run_id: str | None = None  # the run that claimed the folder (hctool/supervise/runlock.py)
        self.foreign: set[str] = set()  # trace files of anything else there: never read

    def poll(self) -> list[Event]:
        new: list[Event] = []
        self.more = False
        self.blocks = []
        names = trace_files(self.path)
        if self.run_id is None:
            self.run_id = runlock.claimed_run(self.path) or ""
        for name in names:
            m = TRACE_NAME.match(os.path.basename(name))
            if not m or m.group(1) == "X" or name in self.foreign:
                continue
            f = self._files.get(name)
            if f is None and self.run_id and not self._of_this_run(name):
                continue
            if f is None:
                rank = int(m.group(1))
                if self.strict and rank >= MAX_WORLD:
                    raise TraceError(f"{name}: rank {rank} is beyond any world size hctool reads ({MAX_WORLD})")
                f = self._files[name] = _File(name, RankTrace(rank, int(m.group(2))))
                self.ranks[rank] = f.rt
            try:
                self._poll_file(f, new)
            except TraceError:
                if self.strict:
                    raise
            except OSError as exc:
                if self.strict:
                    raise TraceError(f"{name}: {exc}") from None
        return new

    def _of_this_run(self, name: str) -> bool:
        """Whether the header of trace `name` names the folder's run; False until it is written."""
        try:
            fd = open_regular(os.path.join(self.path, name), None)
        except TraceError:
            return False
        try:
            first = os.pread(fd, MAX_LINE, 0).split(b"\n", 1)
        finally:
            os.close(fd)
        if len(first) < 2:
            return False  # the header is not written yet: look again at the next poll
        try:
            run = json.loads(first[0]).get("run")
        except (ValueError, AttributeError):
            run = None
        if run == self.run_id:
            return True
        self.foreign.add(name)
        said = (os.path.realpath(self.path), name)
        if said in _SAID:
            return False
        _SAID.add(said)  # once per file, however many readers (live, final, the page) look at the folder
        log.info(
            f"hctool: ignoring {name}: written by {f'run {run}' if run else 'a process of no run'}, "
            f"not by the run that claimed the folder ({self.run_id})"
        )
        return False

    def _poll_file(self, f: _File, new: list) -> None:
        base = os.path.join(self.path, f.name[: -len(".jsonl")])
        ended = f.rt.ended
        if self.interner is not None:
            rows, slots = self._read_ring_rows(f, base + ".ring")  # first: its ids are in the side table by now
            self._read_side(f, base + ".jsonl", new)
            if f.rt.ended and not ended:
                more, more_slots = self._read_ring_rows(f, base + ".ring")
                if len(more):
                    rows, slots = np.concatenate([rows, more]), np.concatenate([slots, more_slots])
            records = self._columns(f, rows, slots, base + ".ring")
        else:
            records = self._read_ring(f, base + ".ring")  # first: every id it uses is in the side table by now
            self._read_side(f, base + ".jsonl", new)
            if f.rt.ended and not ended:
                # The end record follows the rank's last call, which may have been written
                # after the ring was read: read it now, or the rank looks absent from it.
                records += self._read_ring(f, base + ".ring")
        for rec in records:
            try:
                new.extend(self._ring_event(f, rec))
            except (KeyError, TypeError, ValueError):
                if self.strict:
                    raise TraceError(
                        f"{f.name[:-6]}.ring: record {rec.slot} refers to names its side table lacks"
                    ) from None
        if f.open:
            self._recheck_open(f, base + ".ring")

    # ------------------------------------------------------------ ring

    def _read_ring(self, f: _File, path: str) -> list[CallRecord]:
        if not os.path.lexists(path):
            return []
        fd = open_regular(path, MAX_RING_BYTES if self.strict else None)
        try:
            data = os.pread(fd, RING_CHUNK * RECORD_SIZE, f.next_slot * RECORD_SIZE)
        finally:
            os.close(fd)
        out = []
        usable = len(data) - len(data) % RECORD_SIZE
        for raw in CALL.iter_unpack(data[:usable]):
            kind = raw[0]
            if kind == KIND_EMPTY:
                return out  # not written yet (or still being written)
            slot = f.next_slot
            f.next_slot += 1
            if kind == KIND_CALL:
                out.append(CallRecord.unpack(slot, raw))
            elif kind != KIND_VOID and self.strict:
                raise TraceError(f"{os.path.basename(path)}: record {slot} has unknown kind {kind}")
        self.more = self.more or usable == RING_CHUNK * RECORD_SIZE
        return out

    def _read_ring_rows(self, f: _File, path: str) -> np.ndarray:
        """_read_ring, as numpy rows (columns.RECORD_DTYPE): no Python object per call."""
        if not os.path.lexists(path):
            return np.empty(0, dtype=RECORD_DTYPE), np.empty(0, dtype=np.int64)
        fd = open_regular(path, MAX_RING_BYTES if self.strict else None)
        try:
            data = os.pread(fd, RING_CHUNK * RECORD_SIZE, f.next_slot * RECORD_SIZE)
        finally:
            os.close(fd)
        usable = len(data) - len(data) % RECORD_SIZE
        rows = np.frombuffer(data[:usable], dtype=RECORD_DTYPE)
        empty = np.flatnonzero(rows["kind"] == KIND_EMPTY)
        if len(empty):
            rows = rows[: empty[0]]  # not written yet (or still being written)
        else:
            self.more = self.more or usable == RING_CHUNK * RECORD_SIZE
        if self.strict:
            bad = np.flatnonzero((rows["kind"] != KIND_CALL) & (rows["kind"] != KIND_VOID))
            if len(bad):
                raise TraceError(
                    f"{os.path.basename(path)}: record {f.next_slot + int(bad[0])} has unknown kind "
                    f"{int(rows['kind'][bad[0]])}"
                )
        first = f.next_slot
        f.next_slot += len(rows)
        keep = rows["kind"] == KIND_CALL
        if keep.all():
            return rows, np.arange(first, first + len(rows), dtype=np.int64)
        return rows[keep], first + np.flatnonzero(keep)

    def _columns(self, f: _File, rec: np.ndarray, slots: np.ndarray, path: str) -> list[CallRecord]:
        """Completed non-p2p calls into column blocks (self.blocks), per channel; the rest as
        CallRecords for the ordinary path."""
        if len(rec) == 0:
            return []
        if f.cols is None:
            from hctool.consensus.columns import FileColumns

            f.cols = FileColumns(self.interner, f.tables, f.groups)
        try:
            hard, key, op, p2p = f.cols.columns(rec)
        except (KeyError, TypeError, ValueError, AttributeError):
            if self.strict:
                raise TraceError(f"{os.path.basename(path)}: a record refers to names its side table lacks") from None
            return []
        fold = (rec["state"] == STATE_COMPLETED) & ~p2p
        # A channel's calls must stay in order: per group, only the leading run of completed calls
        # goes into a block; from the group's first other call on, its calls are records.
        group = rec["group"].astype(np.int64)
        for gid in np.unique(group[~fold & ~p2p]).tolist():
            first = int(np.flatnonzero((group == gid) & ~fold)[0])
            fold[first:] &= group[first:] != gid
        records = [CallRecord.unpack(int(slot), tuple(r.item())[:13]) for slot, r in zip(slots[~fold], rec[~fold])]
        if fold.any():
            idx = np.flatnonzero(fold)
            groups = rec["group"][idx]
            for gid in np.unique(groups).tolist():
                sel = idx[groups == gid]
                key_name = f.groups[gid]
                sub_rows, sub_slots = rec[sel], slots[sel]

                def make(i, sub_rows=sub_rows, sub_slots=sub_slots, f=f):
                    evs = self._ring_event(f, CallRecord.unpack(int(sub_slots[i]), tuple(sub_rows[i].item())[:13]))
                    return evs[0]

                from hctool.consensus.columns import Block

                self.blocks.append(
                    (
                        f.rt.rank,
                        key_name,
                        Block(
                            f.rt.rank,
                            hard[sel],
                            key[sel],
                            op[sel],
                            make,
                            sub_rows["t"],
                            sub_rows["th"].astype(np.int64),
                        ),
                    )
                )
        return records

    def _ring_event(self, f: _File, c: CallRecord) -> list[Event]:
        op_name = f.tables["op"][c.op]
        s = f.tables["site"][c.site] if c.site else _NO_SITE
        d = f.tables["desc"][c.desc]
        rec = {
            "g": f.groups[c.group],
            "op": op_name,
            "sh": d.get("sh", []),
            "dt": d.get("dt", []),
            "ro": f.tables["ro"][c.reduce_op] if c.reduce_op else None,
            "site": s.site,
            "fn": s.fn,
            "stack": list(s.stack),
            "th": f.tables["th"].get(c.thread),
            "t": c.t,
            "w": c.t + f.wall_offset,
            "async": bool(c.flags & FLAG_ASYNC),
        }
        root = c.root
        if "p2p" in d:
            rec["p2p"] = d["p2p"]
        if op_name in P2P_DIR:
            rec["dir"], rec["peer"] = P2P_DIR[op_name], None if root == NO_ROOT else root
        elif root != NO_ROOT:
            rec["root"] = root
        evs = split_event(f.rt.rank, rec)
        self._set_state(f, c.slot, evs, c.state, c.t_done)
        if c.state == STATE_ENTERED:
            f.open[c.slot] = evs
        if evs:
            f.rt.last_event = evs[0]
        return evs

    def _set_state(self, f: _File, slot: int, evs: list, state: int, t_done: float) -> None:
        for ev in evs:
            ev["state"] = _STATE.get(state, "blocked")
            if state != STATE_ENTERED:
                ev["t_done"] = t_done
            if state == STATE_FAILED:
                ev["err"] = f.errors.get(slot + 1, "failed")

    def _recheck_open(self, f: _File, path: str) -> None:
        """Completion rewrites a record's state byte in place: re-read the open ones."""
        fd = open_regular(path, MAX_RING_BYTES if self.strict else None)
        try:
            for slot in list(f.open):
                if not isinstance(slot, int):
                    continue  # a side-table event (a group creation): its completion line closes it
                data = os.pread(fd, RECORD_SIZE, slot * RECORD_SIZE)
                if len(data) == RECORD_SIZE and data[1] != STATE_ENTERED:
                    t_done = CALL.unpack(data)[12]
                    self._set_state(f, slot, f.open.pop(slot), data[1], t_done)
        finally:
            os.close(fd)

    # ------------------------------------------------------------ side table

    def _read_side(self, f: _File, path: str, new: list) -> None:
        fd = open_regular(path, MAX_SIDE_BYTES if self.strict else None)
        try:
            data = os.pread(fd, SIDE_CHUNK, f.side_off)
        finally:
            os.close(fd)
        if not data:
            return
        f.side_off += len(data)
        self.more = self.more or len(data) == SIDE_CHUNK
        lines = (f.partial + data).split(b"\n")
        f.partial = lines.pop()  # a line still being written
        if len(f.partial) > MAX_LINE and self.strict:
            raise TraceError(f"{f.name}:{f.line_no + 1}: line longer than {MAX_LINE >> 20} MiB")
        for line in lines:
            f.line_no += 1
            if not line.strip():
                continue
            try:
                _check(len(line) <= MAX_LINE, "line too long")
                rec = json.loads(line)
                _check(isinstance(rec, dict), "not a JSON object")
                self._fold(f, rec, new)
            except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
                if self.strict:
                    why = "nested too deeply" if isinstance(exc, RecursionError) else exc
                    raise TraceError(f"{f.name}:{f.line_no}: not an hctool trace record ({why})") from None

    def _fold(self, f: _File, rec: dict, new: list) -> None:
        if "i" in rec:
            kind, ident, v = rec["i"], rec["id"], rec["v"]
            _check(kind in f.tables and _is_int(ident, 1), "bad interned id")
            _check(len(f.tables[kind]) < MAX_INTERNED, f"more than {MAX_INTERNED} interned {kind} values")
            if kind == "site":
                _check(
                    isinstance(v.get("site"), str) and isinstance(v.get("fn"), str) and _strs(v.get("stack")),
                    "bad site",
                )
                v = Site(v["site"], v["fn"], tuple(v["stack"]))
            elif kind == "desc":
                _check(
                    isinstance(v, dict) and all(isinstance(v.get(k, []), list) for k in ("sh", "dt", "p2p")),
                    "bad shapes",
                )
                _check(
                    all(
                        isinstance(p, list)
                        and len(p) == 4
                        and p[0] in ("send", "recv")
                        and (p[1] is None or _is_int(p[1], 0, MAX_WORLD))
                        for p in v.get("p2p", [])
                    ),
                    "bad p2p",
                )
            else:
                _check(isinstance(v, str), f"bad {kind}")
            f.tables[kind][ident] = v
        elif "xr" in rec:
            _check(_is_int(rec["xr"], 1), "bad token")
            f.errors[rec["xr"]] = str(rec.get("err"))[:300]
        elif "e" in rec:  # a labelled event (or a call of a version-1 trace)
            _check(
                isinstance(rec["g"], str)
                and isinstance(rec["op"], str)
                and _strs(rec.get("stack", []))
                and isinstance(rec.get("sh", []), list)
                and isinstance(rec.get("dt", []), list)
                and all(isinstance(rec.get(k, 0.0), (int, float)) for k in ("t", "w"))
                and all(isinstance(rec.get(k), (str, type(None))) for k in ("label", "digest", "site", "fn")),
                "bad event",
            )
            evs = split_event(f.rt.rank, rec)
            if rec.get("st") != "c":
                f.open[("j", rec["e"])] = evs
            f.rt.last_event = evs[0] if evs else f.rt.last_event
            new.extend(evs)
        elif "c" in rec or "x" in rec:  # version-1 completion lines
            for ev in f.open.pop(("j", rec.get("c", rec.get("x"))), ()):
                ev["state"] = "completed" if "c" in rec else "failed"
                ev["t_done"] = rec.get("t")
        elif "grp" in rec:
            ranks = rec["ranks"]
            _check(
                isinstance(rec["grp"], str)
                and isinstance(ranks, list)
                and len(ranks) <= MAX_WORLD
                and all(_is_int(r, 0, MAX_WORLD) for r in ranks),
                "bad group",
            )
            _check(rec["grp"] in self.groups or len(self.groups) < MAX_WORLD, "too many groups")
            self.groups[rec["grp"]] = ranks
            if "id" in rec:
                f.groups[rec["id"]] = rec["grp"]
        elif "hdr" in rec:
            ws, rank = rec.get("world_size"), rec.get("rank")
            _check(ws is None or _is_int(ws, 1, MAX_WORLD + 1), f"world_size {ws!r} is not 1..{MAX_WORLD}")
            _check(rank is None or rank == f.rt.rank, f"header rank {rank!r} differs from the file name's")
            f.rt.header = rec
            f.wall_offset = float(rec.get("start", 0.0)) - float(rec.get("mono", 0.0))
            if ws:
                self.world_size = max(self.world_size or 0, ws)
        elif "pr" in rec:  # a probed function was entered (hctool/agent/probes.py)
            _check(
                isinstance(rec["pr"], str)
                and isinstance(rec.get("t", 0.0), (int, float))
                and all(isinstance(rec.get(k), (str, type(None))) for k in ("site", "fn", "th")),
                "bad probe",
            )
            counts = f.rt.probe_counts
            _check(rec["pr"] in counts or len(counts) < MAX_INTERNED, "too many probe names")
            counts[rec["pr"]] = counts.get(rec["pr"], 0) + 1
            if len(f.rt.probes) < MAX_PROBES:
                f.rt.probes.append((float(rec.get("t", 0.0)), rec["pr"], rec.get("site"), rec.get("fn")))
        elif "trace_truncated" in rec:  # the folder was full: this process recorded nothing after it
            _check(isinstance(rec["trace_truncated"], str) and _is_int(rec.get("slot", 0)), "bad truncation mark")
            f.rt.truncated = {"why": rec["trace_truncated"], "slot": rec.get("slot", 0)}
        elif "end" in rec:
            _check(
                isinstance(rec.get("error"), (str, type(None))) and isinstance(rec.get("t", 0.0), (int, float)),
                "bad end record",
            )
            f.rt.ended = "crashed" if rec.get("error") else "clean"
            f.rt.end_error = rec.get("error")
            f.rt.end_t = rec.get("t")
        else:
            raise ValueError("unknown record")


def split_event(rank: int, rec: dict) -> list[Event]:
    """One recorded call -> the events the aligner compares; a batch_isend_irecv
    becomes one p2p event per peer operation, all sharing the call's state."""
    state = "completed" if rec.get("st") == "c" else "blocked"
    base = {
        "rank": rank,
        "g": rec["g"],
        "op": rec["op"],
        "sh": rec.get("sh", []),
        "dt": rec.get("dt", []),
        "ro": rec.get("ro"),
        "root": rec.get("root"),
        "label": rec.get("label"),
        "digest": rec.get("digest"),
        "value": rec.get("value"),
        "site": rec.get("site"),
        "fn": rec.get("fn"),
        "stack": rec.get("stack", []),
        "th": rec.get("th"),
        "t": rec.get("t"),
        "w": rec.get("w"),
        "state": state,
        "async": rec.get("async", False),
    }
    if "p2p" in rec:
        return [
            dict(base, dir=d, peer=peer, sh=sh, dt=dt, op="isend" if d == "send" else "irecv")
            for d, peer, sh, dt in rec["p2p"]
        ]
    if "dir" in rec:
        base.update(dir=rec["dir"], peer=rec.get("peer"))
    return [base]
