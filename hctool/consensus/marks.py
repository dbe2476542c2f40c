"""Marks: things that happened during a run other than collectives, for the
timeline (the Chrome export's instant events, the HTML report's fault rows).

A Mark is generic on purpose: any source (a fault's window, a chaos
controller action, a probe entry, a fault's firing count) can hand the
exporter a list of them. `run_marks(run_dir)` reads the sources a run folder
has today:
  - chaos runs: the exploration's history.jsonl (when each fault was switched
    on and off, rank pauses, the heal), anchored at the run's chaos/t0;
  - repro and chaos runs: the in-rank faults of commands.txt, drawn over the
    window their spec gives (start_s, duration_s), counted from the workload
    start (chaos) or from each rank's start (repro: what the ranks count from);
  - check-consensus runs: a `faults` list in hctool-run.json, if one is there.
Where a source has firing counts (`fired`), they travel in the mark's args.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

MAX_RECORD_BYTES = 64 << 20  # a history or run record bigger than this is not read


@dataclass(frozen=True)
class Mark:
    name: str
    rank: int | None  # None: the whole job (drawn on every rank, or as a global instant)
    ts: float  # wall clock, seconds (time.time())
    args: dict = field(default_factory=dict, hash=False, compare=False)
    dur: float | None = None  # seconds: a window (a fault that was on) rather than an instant
    kind: str = "event"  # "fault", "controller", "probe", "event": the track and colour
    until_end: bool = False  # a window that lasted until the run ended (dur unknown here)


def run_marks(run_dir, headers: dict[int, dict] | None = None) -> list[Mark]:
    """Every mark the run folder's records give; nothing (never an error) where they have none."""
    run_dir = Path(run_dir)
    marks: list[Mark] = []
    t0 = _chaos_t0(run_dir)
    in_history: set[str] = set()
    if t0 is not None:
        hist = _history_marks(run_dir, t0)
        in_history = {m.args.get("spec") for m in hist if m.kind == "fault"}
        marks += hist
    for spec in _commands_faults(run_dir):
        if spec not in in_history:
            marks += _window_marks(spec, t0, headers or {})
    marks += _record_faults(run_dir, headers or {})
    return marks


def _read_small(path: Path) -> str | None:
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_RECORD_BYTES:
            return None
        return path.read_text(errors="replace")
    except OSError:
        return None


def _chaos_t0(run_dir: Path) -> float | None:
    text = _read_small(run_dir / "chaos" / "t0")
    try:
        return float(text.split()[0]) if text else None
    except (ValueError, IndexError):
        return None


def _fault_rank(spec: str) -> int | None:
    from hctool.protocol.faults import parse_fault

    try:
        return parse_fault(spec).rank
    except ValueError:
        return None


def _history_marks(run_dir: Path, t0: float) -> list[Mark]:
    """This run's part of the exploration's history (between its invoke and its verdict)."""
    text = _read_small(run_dir.parent / "history.jsonl")
    if not text:
        return []
    mine, marks, open_faults = False, [], {}
    end = None
    for line in text.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if not isinstance(ev, dict):
            continue
        if ev.get("event") == "invoke":
            mine = ev.get("run") == run_dir.name
            continue
        if not mine:
            continue
        at = ev.get("at_s")
        at = t0 + float(at) if isinstance(at, (int, float)) else None
        what = ev.get("event")
        if what == "fault-on" and at is not None:
            open_faults[ev.get("fault")] = at
        elif what == "fault-off" and at is not None and ev.get("fault") in open_faults:
            spec = ev["fault"]
            start = open_faults.pop(spec)
            marks.append(
                Mark(
                    f"fault {spec}",
                    _fault_rank(spec),
                    start,
                    {"spec": spec, "source": "chaos history"},
                    dur=at - start,
                    kind="fault",
                )
            )
        elif what in ("heal", "rank-continue") and at is not None:
            marks.append(
                Mark(what, None, at, {k: v for k, v in ev.items() if k not in ("t", "event")}, kind="controller")
            )
            end = at if what == "heal" else end
        elif what == "verdict":
            break
    for spec, start in open_faults.items():  # on until the heal (or a one-shot action)
        marks.append(
            Mark(
                f"fault {spec}",
                _fault_rank(spec),
                start,
                {"spec": spec, "source": "chaos history"},
                dur=(end - start) if end and end > start else None,
                kind="fault",
                until_end=not end,
            )
        )
    marks.append(Mark("workload start", None, t0, {"source": "chaos/t0"}, kind="controller"))
    return marks


def _commands_faults(run_dir: Path) -> list[str]:
    """The in-rank fault specs of a harness run: `# scenario ID; faults: A, B; probes: ...`."""
    text = _read_small(run_dir / "commands.txt")
    if not text:
        return []
    first = text.splitlines()[0] if text.splitlines() else ""
    if "; faults: " not in first:
        return []
    listed = first.split("; faults: ", 1)[1].split("; probes: ", 1)[0]
    return [] if listed.strip() == "none" else [s.strip() for s in listed.split(", ") if s.strip()]


def _window_marks(spec: str, t0: float | None, headers: dict[int, dict], fired=None) -> list[Mark]:
    from hctool.protocol.faults import parse_fault

    try:
        f = parse_fault(spec)
    except ValueError:
        return []
    args = {"spec": spec, "source": "fault spec (its window; when it fired is not recorded)"}
    if fired is not None:
        args = {"spec": spec, "fired": fired, "source": "run record"}
    ranks = [f.rank] if f.rank is not None else sorted(headers) or [None]
    out = []
    for r in ranks:
        start = t0 if t0 is not None else _rank_start(headers.get(r) if r is not None else None, headers)
        if start is None:
            continue
        out.append(
            Mark(
                f"fault {spec}",
                r,
                start + f.start_s,
                args,
                dur=f.duration_s,
                kind="fault",
                until_end=f.duration_s is None,
            )
        )
    return out


def _rank_start(header: dict | None, headers: dict[int, dict]) -> float | None:
    if header and isinstance(header.get("start"), (int, float)):
        return float(header["start"])
    starts = [h["start"] for h in headers.values() if isinstance(h.get("start"), (int, float))]
    return min(starts) if starts else None


def _record_faults(run_dir: Path, headers: dict[int, dict]) -> list[Mark]:
    """hctool-run.json's `faults`: specs, or {"spec", "fired"} objects (with firing counts)."""
    text = _read_small(run_dir / "hctool-run.json")
    try:
        faults = json.loads(text).get("faults") if text else None
    except (ValueError, AttributeError):
        return []
    out = []
    for f in faults if isinstance(faults, list) else []:
        spec = f if isinstance(f, str) else f.get("spec") if isinstance(f, dict) else None
        if isinstance(spec, str):
            out += _window_marks(spec, None, headers, fired=f.get("fired") if isinstance(f, dict) else None)
    return out
