"""The chaos report (the JSON contract of docs/contracts.md), its rendering, and merging
the reports of CI shards."""

from __future__ import annotations

import json
from pathlib import Path

from hctool.chaos.invariants import Anomaly
from hctool.chaos.runner import RunResult
from hctool.chaos.schedule import Schedule
from hctool.chaos.target import Target  # or a chaos.command.CommandTarget: both have label and replay
from hctool.protocol.safefile import read_named, why


def anomaly_entry(
    a: Anomaly, sched: Schedule, replay_cmd: str, shrunk: Schedule | None = None, reproduced: str | None = None
) -> dict:
    return {
        "invariant": a.invariant,
        "evidence": a.evidence,
        "schedule": [f.to_dict() for f in sched.faults],
        "shrunk": None if shrunk is None else [f.to_dict() for f in shrunk.faults],
        "replay": replay_cmd,
        "reproduced": reproduced,
    }


def replay_command(path: Path, target: Target, runs: int = 1) -> str:
    # options before the target: a launch target ends with engine flags after `--`
    return f"hctool chaos run {path}" + (f" --runs {runs}" if runs > 1 else "") + f" {target.replay}"


def build(
    target: Target, seed: int, runs: list[tuple[Schedule, RunResult]], anomalies: list[dict], history: Path, **extra
) -> dict:
    verdicts = [r.verdict for _, r in runs]
    verdict = "invalid" if anomalies else "unknown" if (not runs or "unknown" in verdicts) else "valid"
    return {
        "verdict": verdict,
        "target": target.label,
        "seed": seed,
        "schedules": len(runs),
        "anomalies": anomalies,
        "history": str(history),
        **extra,
        "runs": [
            {
                "name": r.name,
                "schedule": s.specs(),
                "verdict": r.verdict,
                "invariants": sorted({a.invariant for a in r.anomalies}),
                "blind": r.blind,
                "seconds": r.seconds,
                "artifacts": r.run_dir,
            }
            for s, r in runs
        ],
    }


def merge_problem(reports: list[dict]) -> str | None:
    """Why these reports are not shards of one exploration (None: they can be merged): another
    target, another seed, or a shard given twice (the same report twice counted its runs twice)."""
    targets = sorted({str(r.get("target", "")) for r in reports})
    if len(targets) > 1:
        return f"reports of different targets: {' | '.join(targets)}"
    seeds = sorted({str(r.get("seed")) for r in reports})
    if len(seeds) > 1:
        return f"reports of different seeds ({', '.join(seeds)}): shards of one exploration share its seed"
    seen: set = set()
    for r in reports:
        key = (r.get("shard"), r.get("history"))
        if key in seen:
            return f"shard {r.get('shard')} is given twice (history {r.get('history')})"
        seen.add(key)
    return None


def merge(reports: list[dict]) -> dict:
    """Shards of one exploration (or any reports): anomalies and runs concatenated,
    invalid if any shard is, valid only if every shard is."""
    verdicts = [r.get("verdict") for r in reports]
    verdict = (
        "invalid"
        if "invalid" in verdicts
        else "valid"
        if verdicts and all(v == "valid" for v in verdicts)
        else "unknown"
    )
    targets = sorted({r.get("target", "") for r in reports})
    return {
        "verdict": verdict,
        "target": targets[0] if len(targets) == 1 else " | ".join(targets),
        "seed": reports[0].get("seed") if reports else None,
        "schedules": sum(int(r.get("schedules", 0)) for r in reports),
        "anomalies": [a for r in reports for a in r.get("anomalies", [])],
        "history": reports[0].get("history") if reports else None,
        "histories": [r.get("history") for r in reports],
        "shards": [r.get("shard") for r in reports],
        "runs": [x for r in reports for x in r.get("runs", [])],
    }


MAX_REPORT_BYTES = 256 << 20  # a report of many shards' runs; never a stream read until memory runs out


def load_report(path: Path) -> dict:
    """A shard's report as `chaos merge` needs it: read through the safe reader (a FIFO hung the
    merge), type-checked (ValueError, one line: the merge and its render index these keys)."""
    try:
        data = json.loads(read_named(path, MAX_REPORT_BYTES))
    except OSError as exc:
        raise ValueError(why(exc, path)) from None
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{path}: not JSON ({str(exc)[:200] or 'nested too deeply'})") from None
    if not isinstance(data, dict) or "verdict" not in data or "anomalies" not in data:
        raise ValueError(f"{path} is not a chaos report (no verdict/anomalies)")
    if (
        data["verdict"] not in ("valid", "invalid", "unknown")
        or not isinstance(data["anomalies"], list)
        or not all(isinstance(a, dict) for a in data["anomalies"])
        or not isinstance(data.get("runs", []), list)
        or not all(isinstance(r, dict) for r in data.get("runs", []))
        or not isinstance(data.get("target", ""), str)
        or isinstance(data.get("schedules", 0), bool)
        or not isinstance(data.get("schedules", 0), int)
    ):
        raise ValueError(f"{path} is not a chaos report (verdict, anomalies or runs of the wrong type)")
    return data


def render(report: dict, console) -> None:
    from rich.table import Table
    from rich.text import Text

    style = {"valid": "green", "invalid": "red", "unknown": "yellow"}[report["verdict"]]
    console.print(
        Text(
            f"chaos {report['target']}: {report['verdict']} over {report['schedules']} schedule(s)",
            style=f"bold {style}",
        )
    )
    if report.get("runs"):
        table = Table()
        for col in ("run", "schedule", "verdict", "invariants", "seconds"):
            table.add_column(col, overflow="fold")
        for r in report["runs"][-20:]:
            table.add_row(
                r["name"],
                "\n".join(r["schedule"]) or "-",
                r["verdict"],
                ", ".join(r["invariants"]) or "-",
                f"{r['seconds']:.0f}",
            )
        console.print(table)
    for i, a in enumerate(report["anomalies"], 1):
        console.print(Text(f"\nanomaly {i}: {a['invariant']}", style="bold red"))
        ev = a["evidence"] if isinstance(a["evidence"], dict) else {}
        if ev.get("cause"):  # a consensus finding: the cause and the culprit first
            console.print(Text(str(ev["cause"]), style="bold"), soft_wrap=True)
            if ev.get("symptom"):
                console.print(Text(str(ev["symptom"])), soft_wrap=True)
        elif ev:  # another invariant's evidence: one line per fact, not one JSON line
            for key, value in ev.items():
                text = value if isinstance(value, str) else json.dumps(value, default=str)
                console.print(Text(f"  {key}: {text[:400]}"), soft_wrap=True)
        else:
            console.print(Text(str(a["evidence"])[:1500]), soft_wrap=True)
        if "counts" in a["evidence"]:  # the calls each rank was seen making, as the JSON has them
            from hctool.consensus.report import counts_line

            console.print(Text(counts_line(a["evidence"]), style="dim"), soft_wrap=True)
        if a.get("shrunk") is not None:  # as the faults are written on the command line
            specs = "; ".join(_spec(f) for f in a["shrunk"])
            console.print(Text(f"shrunk to {len(a['shrunk'])} fault(s): {specs}"), soft_wrap=True)
        if a.get("reproduced"):
            console.print(Text(f"reproduced {a['reproduced']}"))
        console.print(Text(f"replay: {a['replay']}", style="bold"))
    console.print(Text(f"history: {report['history']}"))


def _spec(fault) -> str:
    """A fault of the JSON report as its text form (`kind:key=value,...`)."""
    from hctool.protocol.faults import Fault

    try:
        return Fault.from_dict(fault).spec() if isinstance(fault, dict) else str(fault)
    except (ValueError, TypeError):
        return json.dumps(fault, default=str)
