"""What a run folder is, and the traced runs inside it.

Folders hctool's runners write:
  check-consensus run  rank*.jsonl/.ring traces (+ hctool-run.json)   kind "consensus"
  Flight Recorder      a folder of FR dumps                             kind "flight-recorder"
  repro ID             report.json {"id", "variants"}, one folder per variant
                       (NAME/report.json, NAME/traces/)                 kind "repro"
  repro all            one repro folder per incident                    kind "repro-all"
  chaos run|explore    report.json {"verdict", "anomalies", "runs"}, history.jsonl,
                       one harness folder per run                       kind "chaos"
  one variant or run   report.json {"name", "verdict"} + traces/        kind "run"
Folders may come from someone else: documents are size-limited, type-checked,
and a bad one is a FolderError (one line), never a traceback.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hctool.consensus.flight_recorder import is_flight_recorder_dir
from hctool.consensus.trace import trace_files
from hctool.protocol.safefile import read_regular

MAX_DOC_BYTES = 64 << 20


class FolderError(ValueError):
    """Not a folder hctool wrote (the message says why)."""


@dataclass
class TracedRun:
    """One run with traces: what the report and the export draw."""

    name: str
    run_dir: Path  # its folder (run records, commands.txt, chaos/)
    trace_dir: Path
    doc: dict = field(default_factory=dict)  # the runner's document for it (variant report, run record)


@dataclass
class Folder:
    kind: str
    path: Path
    doc: dict | None = None  # the runner's document for the whole folder


def read_doc(path: Path) -> dict | None:
    if not os.path.lexists(path):
        return None
    try:  # the safe reader: a FIFO swapped in after a check would block a plain read
        raw = read_regular(path, MAX_DOC_BYTES)
    except OSError as exc:
        raise FolderError(f"{path}: not a small regular file ({exc.strerror})") from None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise FolderError(f"{path}: not JSON ({str(exc)[:200] or 'nested too deeply'})") from None
    if not isinstance(doc, dict):
        raise FolderError(f"{path}: not a JSON object")
    return check_shape(doc, str(path))


# The types of what the report reads from a runner's document, per kind of object in it. A
# field may be absent or null; anything else of another type is a FolderError naming it (a
# report.json of wrong types was a TypeError, KeyError or AttributeError: an internal error).
_NUM = (int, float)
_STRS = ("strs",)
_SHAPES: dict[str, dict[str, tuple]] = {
    "doc": {
        "verdict": (str,),
        "name": (str,),
        "reason": (str,),
        "id": (str,),
        "title": (str,),
        "target": (str,),
        "history": (str,),
        "first_divergence": (dict,),
        "stacks": (dict,),
        "schedule": _STRS,
        "invariants": _STRS,
        "artifacts": (str,),
        "variants": ("variant",),
        "runs": ("run",),
        "anomalies": ("anomaly",),
        "incidents": ("doc",),
    },
    "variant": {
        "name": (str,),
        "expected": _STRS,
        "verdict": (str,),
        "ok": (bool,),
        "seconds": _NUM,
        "artifacts": (str,),
        "reason": (str,),
        "first_divergence": (dict,),
        "stacks": (dict,),
        "requests": (dict,),
    },
    "run": {
        "name": (str,),
        "schedule": _STRS,
        "verdict": (str,),
        "invariants": _STRS,
        "blind": _STRS,
        "seconds": _NUM,
        "artifacts": (str,),
    },
    "anomaly": {"invariant": (str,), "schedule": (list,), "shrunk": (list,), "replay": (str,), "reproduced": (str,)},
}


def check_shape(doc: dict, where: str, kind: str = "doc") -> dict:
    """`doc` when every field the report reads has its type (see _SHAPES), else FolderError."""
    for key, types in _SHAPES[kind].items():
        value = doc.get(key)
        if value is None:
            continue
        if types == _STRS:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        elif isinstance(types[0], str):  # a list of objects of that kind
            ok = isinstance(value, list) and all(isinstance(v, dict) for v in value)
            if ok:
                for i, v in enumerate(value):
                    check_shape(v, f"{where}: {key}[{i}]", types[0])
        else:
            ok = isinstance(value, types) and not (bool not in types and isinstance(value, bool))
        if not ok:
            want = (
                "a list of strings"
                if types == _STRS
                else "a list of objects"
                if isinstance(types[0], str)
                else " or ".join(t.__name__ for t in types)
            )
            raise FolderError(f"{where}: {key} must be {want}, got {type(value).__name__}")
    return doc


def identify(path: Path, doc: dict | None = None) -> Folder:
    """doc: the runner's result when the caller has it (the run-end hook), else report.json."""
    path = Path(path)
    if not path.is_dir():
        raise FolderError(f"not a folder: {path}")
    if doc is None:
        doc = read_doc(path / "report.json")
    if doc is not None and isinstance(doc.get("variants"), list):
        return Folder("repro", path, doc)
    if doc is not None and isinstance(doc.get("incidents"), list):
        return Folder("repro-all", path, doc)
    if doc is not None and isinstance(doc.get("runs"), list) and "anomalies" in doc:
        return Folder("chaos", path, doc)
    if (path / "traces").is_dir():
        return Folder("run", path, doc)
    if trace_files(str(path)):
        return Folder("consensus", path, doc)
    if is_flight_recorder_dir(str(path)):
        return Folder("flight-recorder", path, doc)
    subs = [p for p in sorted(path.iterdir()) if p.is_dir() and (p / "report.json").is_file()]
    if subs and all(isinstance((read_doc(p / "report.json") or {}).get("variants"), list) for p in subs):
        return Folder("repro-all", path, {"incidents": [read_doc(p / "report.json") for p in subs]})
    if (path / "hctool-run.json").is_file():
        return Folder("consensus", path, doc)  # a run that recorded nothing: its page says what was not seen
    raise FolderError(f"{path}: no traces, Flight Recorder dumps or hctool run records in it")


def artifacts_dir(root: Path, given) -> Path | None:
    """A run's `artifacts` path as recorded (relative to where the runner ran), or the
    folder of that name inside root (the folder was moved or is read from elsewhere)."""
    if not isinstance(given, str) or not given:
        return None
    p = Path(given)
    for cand in (p, root / p.name, root.parent / p):
        if cand.is_dir():
            return cand
    return None


def traced_runs(folder: Folder) -> list[TracedRun]:
    """Every run of the folder that has traces, in the runner's order."""
    f, out = folder, []
    if f.kind in ("consensus", "flight-recorder"):
        return [
            TracedRun(
                "check-consensus run" if f.kind == "consensus" else "Flight Recorder dumps", f.path, f.path, f.doc or {}
            )
        ]
    if f.kind == "run":
        return [TracedRun((f.doc or {}).get("name") or f.path.name, f.path, f.path / "traces", f.doc or {})]
    if f.kind == "repro":
        for v in f.doc["variants"]:
            d = artifacts_dir(f.path, v.get("artifacts")) if isinstance(v, dict) else None
            if d is not None and (d / "traces").is_dir():
                out.append(TracedRun(str(v.get("name")), d, d / "traces", v))
    elif f.kind == "chaos":
        for r in f.doc["runs"]:
            d = artifacts_dir(f.path, r.get("artifacts")) if isinstance(r, dict) else None
            # an engine run keeps its traces in traces/; a command run (chaos -- torchrun ...) is a
            # check-consensus run folder, traces beside hctool-run.json
            traces = (
                None if d is None else d / "traces" if (d / "traces").is_dir() else d if trace_files(str(d)) else None
            )
            if traces is not None:
                out.append(TracedRun(str(r.get("name")), d, traces, {**(read_doc(d / "report.json") or {}), **r}))
    elif f.kind == "repro-all":
        for inc in f.doc["incidents"]:
            sub = artifacts_dir(f.path, inc.get("artifacts")) if isinstance(inc, dict) else None
            if sub is not None:
                out += [
                    TracedRun(f"{inc.get('id')} {t.name}", t.run_dir, t.trace_dir, t.doc)
                    for t in traced_runs(Folder("repro", sub, inc))
                ]
    return out


def interesting(run: TracedRun) -> bool:
    """A run whose outcome is not the clean one: the one to show first."""
    return run.doc.get("verdict") not in (None, "healthy", "valid", "consistent") or bool(run.doc.get("invariants"))


def pick(folder: Folder, name: str | None = None) -> TracedRun:
    """The run `name` of a folder, else the first interesting run, else the first."""
    runs = traced_runs(folder)
    if not runs:
        raise FolderError(f"{folder.path}: no run with traces in it")
    if name is not None:
        for r in runs:
            if r.name == name or r.run_dir.name == name:
                return r
        raise FolderError(f"{folder.path}: no run named {name!r}; runs: {', '.join(r.name for r in runs)}")
    return next((r for r in runs if interesting(r)), runs[0])


def analysis(run: TracedRun):
    """The check-consensus report of a run's traces (verdict, first_divergence, counts,
    stacks); where the runner recorded its own verdict and finding (repro, chaos, the
    hook's document) those win: the picture shows what the user was told."""
    from hctool.consensus import analyze_dir
    from hctool.protocol.runrecord import RunRecord, RunRecordError

    try:
        record = RunRecord.read(run.run_dir)
    except RunRecordError as exc:
        raise FolderError(str(exc)) from None
    codes, command_exit, ended_at, stacks = (
        (None, None, None, None)
        if record is None
        else (record.exit_codes, record.command_exit_code, record.ended_at, record.stacks or None)
    )
    report = analyze_dir(
        run.trace_dir, exit_codes=codes, command_exit=command_exit, ended_at=ended_at, stacks=stacks
    )  # as analyze
    return with_runner_doc(report, run.doc)


def with_runner_doc(report, doc: dict):
    """The analysis, with what the runner told the user where it recorded it (its verdict, finding
    and stacks win: the picture shows what the user was told). A document of the wrong shape is a
    FolderError."""
    from hctool.consensus.model import Divergence, ReportError, Verdict

    try:
        if doc.get("verdict") in {v.value for v in Verdict}:
            report.verdict = Verdict(doc["verdict"])
        elif doc.get("verdict"):
            report.extra["runner_verdict"] = str(doc["verdict"])
        if doc.get("first_divergence"):
            report.first_divergence = Divergence.from_json(doc["first_divergence"])
        elif "first_divergence" in doc:
            report.first_divergence = None
        stacks = doc.get("stacks")
        if stacks:
            if not isinstance(stacks, dict):
                raise ReportError("stacks must be an object")
            report.stacks = {str(r): str(t) for r, t in stacks.items()}
    except ReportError as exc:
        raise FolderError(f"{run_name_hint(doc)}report.json: {exc}") from None
    return report


def run_name_hint(doc: dict) -> str:
    name = doc.get("name")
    return f"{name}: " if isinstance(name, str) else ""


def ended_at(run: TracedRun) -> float | None:
    """When the run ended, as far as its folder says: the runner writes its record
    (hctool-run.json, report.json, stacks.txt) right after ending the job."""
    times = []
    for name in ("hctool-run.json", "stacks.txt", "report.json"):
        try:
            times.append((run.run_dir / name).stat().st_mtime)
        except OSError:
            pass
    return min(times) if times else None
