"""Reading PyTorch Flight Recorder dumps (pickles) as a second trace format.

A pickle can run code when loaded, and dump folders come from other people,
so the unpickler here resolves no global at all: only plain containers and
scalars load (what torch writes), anything else is a TraceError naming the
file. Files must be regular and at most MAX_DUMP_BYTES.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import stat

from hctool.consensus.trace import TraceError, open_regular

MAX_DUMP_BYTES = 256 << 20
_SKIP = (".jsonl", ".ring", ".stack", ".log", ".json")


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


def _event(rank: int, e: dict) -> dict | None:
    pg = e.get("process_group") or ("", "")
    gkey = f"fr{e.get('pg_id', pg[0] if pg else '?')}"
    op = str(e.get("profiling_name", "")).split(":", 1)[-1].replace("allreduce", "all_reduce")
    frames = [f for f in e.get("frames") or [] if isinstance(f, dict)]
    user = [f for f in frames if "/torch/" not in str(f.get("filename", ""))
            and "/hctool/" not in str(f.get("filename", ""))]
    top = user[0] if user else (frames[0] if frames else {})
    t = (e.get("time_created_ns") or 0) / 1e9
    return {"rank": rank, "g": gkey, "op": op, "sh": list(e.get("input_sizes", [])),
            "dt": [str(d).replace("torch.", "") for d in e.get("input_dtypes", [])],
            "ro": None, "root": None, "label": None, "digest": None, "value": None,
            "site": f"{os.path.basename(str(top.get('filename', '?')))}:{top.get('line', 0)}" if top else None,
            "fn": top.get("name"), "stack": [f"{f.get('filename')}:{f.get('line')} {f.get('name')}" for f in user[:8]],
            "th": e.get("thread_name"), "t": t, "w": t,
            # gloo entries stay 'scheduled' in 2.13: the state is unknown, call it completed
            "state": "completed" if e.get("state") in ("completed", "scheduled", "started") else "blocked"}


def read_flight_recorder(path: str) -> tuple[dict[int, list[dict]], dict[str, list[int]]]:
    """Flight Recorder pickles -> (events per rank, group ranks). gloo's dumps
    have an empty pg_config in torch 2.13, so a group's members are the ranks
    whose dumps mention it. FR p2p entries carry no peer: only collectives are compared."""
    per_rank: dict[int, list[dict]] = {}
    members: dict[str, set[int]] = {}
    for full in _candidates(path):
        if stat.S_ISDIR(os.lstat(full).st_mode):
            continue
        data = load_dump(full)
        if data is None:
            continue
        m = re.search(r"(\d+)$", os.path.basename(full))
        rank = data.get("rank", int(m.group(1)) if m else len(per_rank))
        if not isinstance(rank, int) or not 0 <= rank < (1 << 16):
            raise TraceError(f"{full}: rank {rank!r} is not a rank")
        try:
            entries = sorted((e for e in data["entries"] if isinstance(e, dict) and not e.get("is_p2p")),
                             key=lambda e: int(e.get("record_id", 0)))
            events = [_event(rank, e) for e in entries]
            json.dumps(events)  # plain data only, or the aligner would trip on it later
        except (TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise TraceError(f"{full}: not a Flight Recorder dump ({exc})") from None
        for ev in events:
            members.setdefault(ev["g"], set()).add(rank)
        per_rank[rank] = events
    return per_rank, {k: sorted(v) for k, v in members.items()}
