"""Reading traces: hctool's JSON-lines files (incrementally, for live mode) and
PyTorch Flight Recorder dumps. Both become per-rank event dicts with a
`state` of "blocked" (entered, not completed), "completed" or "failed"."""

from __future__ import annotations

import json
import os
import pickle
import re
from dataclasses import dataclass, field

_TRACE_NAME = re.compile(r"^rank(\d+|X)-(\d+)\.jsonl$")


@dataclass
class RankTrace:
    rank: int
    pid: int
    header: dict = field(default_factory=dict)
    ended: str | None = None          # None: no end record; "clean" or "crashed"
    end_error: str | None = None
    open_events: dict = field(default_factory=dict)   # id -> [event dicts] not yet completed
    last_event: dict | None = None


class TraceDirReader:
    """Reads new complete lines of every rank{R}-{pid}.jsonl file in a folder;
    `poll()` returns the events that appeared since the previous call."""

    def __init__(self, path: str):
        self.path = path
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}
        self.ranks: dict[int, RankTrace] = {}   # newest process per rank
        self.groups: dict[str, list[int]] = {}
        self.world_size: int | None = None
        self._by_file: dict[str, RankTrace] = {}

    def poll(self) -> list[dict]:
        new: list[dict] = []
        try:
            names = sorted(os.listdir(self.path))
        except FileNotFoundError:
            return new
        for name in names:
            m = _TRACE_NAME.match(name)
            if not m or m.group(1) == "X":
                continue
            full = os.path.join(self.path, name)
            with open(full, "rb") as f:
                f.seek(self.offsets.get(name, 0))
                data = f.read()
            if not data:
                continue
            self.offsets[name] = self.offsets.get(name, 0) + len(data)
            data = self.partial.pop(name, b"") + data
            lines = data.split(b"\n")
            if lines[-1]:
                self.partial[name] = lines[-1]  # a line still being written
            rt = self._by_file.get(name)
            if rt is None:
                rt = self._by_file[name] = RankTrace(int(m.group(1)), int(m.group(2)))
                self.ranks[rt.rank] = rt
            for line in lines[:-1]:
                if line:
                    try:
                        self._fold(rt, json.loads(line), new)
                    except (ValueError, TypeError, KeyError, IndexError):
                        continue  # a torn or foreign line must not stop the analysis
        return new

    def _fold(self, rt: RankTrace, rec: dict, new: list[dict]) -> None:
        if "c" in rec or "x" in rec:
            for ev in rt.open_events.pop(rec.get("c", rec.get("x")), ()):
                ev["state"] = "completed" if "c" in rec else "failed"
                ev["t_done"] = rec.get("t")
                if "err" in rec:
                    ev["err"] = rec["err"]
        elif "e" in rec:
            evs = split_event(rt.rank, rec)
            if rec.get("st") != "c":
                rt.open_events[rec["e"]] = evs
            rt.last_event = evs[0] if evs else rt.last_event
            new.extend(evs)
        elif "grp" in rec:
            self.groups[rec["grp"]] = rec["ranks"]
        elif "hdr" in rec:
            rt.header = rec
            if rec.get("world_size"):
                self.world_size = max(self.world_size or 0, rec["world_size"])
        elif "end" in rec:
            rt.ended = "crashed" if rec.get("error") else "clean"
            rt.end_error = rec.get("error")


def split_event(rank: int, rec: dict) -> list[dict]:
    """One recorded call -> the events the aligner compares; a batch_isend_irecv
    becomes one p2p event per peer operation, all sharing the call's state."""
    state = "completed" if rec.get("st") == "c" else "blocked"
    base = {"rank": rank, "g": rec["g"], "op": rec["op"], "sh": rec.get("sh", []), "dt": rec.get("dt", []),
            "ro": rec.get("ro"), "root": rec.get("root"), "label": rec.get("label"), "digest": rec.get("digest"),
            "value": rec.get("value"), "site": rec.get("site"), "fn": rec.get("fn"), "stack": rec.get("stack", []),
            "th": rec.get("th"), "t": rec.get("t"), "w": rec.get("w"), "state": state, "async": rec.get("async", False)}
    if "p2p" in rec:
        out = []
        for direction, peer, sh, dt in rec["p2p"]:
            out.append(dict(base, dir=direction, peer=peer, sh=sh, dt=dt,
                            op="isend" if direction == "send" else "irecv"))
        return out
    if "dir" in rec:
        base.update(dir=rec["dir"], peer=rec.get("peer"))
    return [base]


# ---------------------------------------------------------------- Flight Recorder

def is_flight_recorder_dir(path: str) -> bool:
    return any(_load_fr(os.path.join(path, n)) is not None for n in sorted(os.listdir(path))[:50]
               if os.path.isfile(os.path.join(path, n)) and not n.endswith((".jsonl", ".stack", ".log")))


def _load_fr(path: str):
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            if head[:1] != b"\x80":  # pickle protocol 2+ marker
                return None
            f.seek(0)
            data = pickle.load(f)  # noqa: S301 - the user's own dump files
    except Exception:
        return None
    return data if isinstance(data, dict) and "entries" in data else None


def read_flight_recorder(path: str) -> tuple[dict[int, list[dict]], dict[str, list[int]]]:
    """Flight Recorder pickles -> (events per rank, group ranks). gloo's dumps
    have an empty pg_config in torch 2.13, so a group's members are the ranks
    whose dumps mention it."""
    per_rank: dict[int, list[dict]] = {}
    members: dict[str, set[int]] = {}
    for name in sorted(os.listdir(path)):
        data = _load_fr(os.path.join(path, name))
        if data is None:
            continue
        m = re.search(r"(\d+)$", name)
        rank = data.get("rank", int(m.group(1)) if m else len(per_rank))
        events = []
        for e in sorted(data["entries"], key=lambda e: e.get("record_id", 0)):
            pg = e.get("process_group") or ("", "")
            gkey = f"fr{e.get('pg_id', pg[0] if pg else '?')}"
            prof = e.get("profiling_name", "")
            op = prof.split(":", 1)[-1].replace("allreduce", "all_reduce").replace("nccl:", "")
            frames = e.get("frames") or []
            user = [f for f in frames if "/torch/" not in f.get("filename", "") and "/hctool/" not in f.get("filename", "")]
            top = user[0] if user else (frames[0] if frames else {})
            ev = {"rank": rank, "g": gkey, "op": op, "sh": e.get("input_sizes", []),
                  "dt": [str(d).replace("torch.", "") for d in e.get("input_dtypes", [])],
                  "ro": None, "root": None, "label": None, "digest": None,
                  "site": f"{os.path.basename(top.get('filename', '?'))}:{top.get('line', 0)}" if top else None,
                  "fn": top.get("name"), "stack": [f"{f.get('filename')}:{f.get('line')} {f.get('name')}" for f in user[:8]],
                  "th": e.get("thread_name"), "t": (e.get("time_created_ns") or 0) / 1e9,
                  "w": (e.get("time_created_ns") or 0) / 1e9,
                  # gloo entries stay 'scheduled' in 2.13: the state is unknown, call it completed
                  "state": "completed" if e.get("state") in ("completed", "scheduled", "started") else "blocked"}
            if e.get("is_p2p"):
                continue  # FR p2p entries carry no peer; only collectives are compared
            events.append(ev)
            members.setdefault(gkey, set()).add(rank)
        per_rank[rank] = events
    return per_rank, {k: sorted(v) for k, v in members.items()}
