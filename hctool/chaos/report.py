"""The chaos report (the JSON contract of docs/contracts.md), its rendering, and merging
the reports of CI shards."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from hctool.console.paths import short_path
from hctool.protocol.safefile import read_named, why

if TYPE_CHECKING:  # the HTML page reads this module's words: it needs none of the runner's imports
    from hctool.chaos.invariants import Anomaly
    from hctool.chaos.runner import RunResult
    from hctool.chaos.schedule import Schedule
    from hctool.chaos.target import Target  # or a chaos.command.CommandTarget: both have label and replay


def anomaly_entry(
    a: Anomaly,
    sched: Schedule,
    replay_cmd: str,
    shrunk: Schedule | None = None,
    reproduced: str | None = None,
    run: str | None = None,
) -> dict:
    return {
        **({} if run is None else {"run": run}),  # the exploration's run that found it
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
        "history": short_path(str(history)),  # as the user opens it from where hctool ran
        **extra,
        "runs": [
            {
                "name": r.name,
                "schedule": s.specs(),
                "verdict": r.verdict,
                "invariants": sorted({a.invariant for a in r.anomalies}),
                "blind": r.blind,
                "seconds": r.seconds,
                "artifacts": short_path(str(r.run_dir)),
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


class AnomalyText(NamedTuple):
    """An anomaly in words: the cause (who, what call, where) or what went wrong, then the
    symptom, then the facts behind them. Both the terminal and the HTML page print these."""

    cause: str
    symptom: str  # "" where the invariant has none apart from its cause
    facts: list[str]


def describe(anomaly: dict) -> AnomalyText:
    """An anomaly of the JSON report in sentences, never as JSON or a Python repr."""
    ev = anomaly.get("evidence")
    ev = ev if isinstance(ev, dict) else {"evidence": ev}
    invariant = anomaly.get("invariant")
    if ev.get("cause"):  # a consensus finding (also a hang's): the checker's own cause and symptom lines
        facts = [] if not ev.get("what") else [str(ev["what"])]
        counts = ev.get("counts")
        if isinstance(counts, dict) and counts and all(isinstance(c, dict) for c in counts.values()):
            from hctool.consensus.report import counts_line

            facts.append(counts_line(ev))
        return AnomalyText(str(ev["cause"]), str(ev.get("symptom") or ""), facts)
    if invariant == "consensus" and ev.get("line"):  # an engine rank died of gloo's size-mismatch abort
        return AnomalyText(
            f"cause: {_words(ev['log']) + '.log' if ev.get('log') else 'a rank log'} shows a collective mismatch: "
            f"{ev['line']}",
            f"symptom: {_words(ev.get('death'))}" if ev.get("death") else "",
            [],
        )
    if invariant == "exits" and isinstance(ev.get("exit_codes"), dict):
        codes = "; ".join(
            f"{'the command' if str(r) == '-1' else f'rank {r}'} exited with code {c}"
            for r, c in ev["exit_codes"].items()
        )
        return AnomalyText(
            codes,
            f"symptom: check-consensus judged the run {ev['verdict']}" if ev.get("verdict") else "",
            [],
        )
    if invariant == "output" and "regex" in ev:
        facts = [f"{label}: {_quoted(ev.get(key))}" for label, key in (("missing", "missing"), ("new", "unexpected"))]
        return AnomalyText(
            f"the output lines matching '{ev['regex']}' are not those of the fault-free run",
            "",
            [f for f, key in zip(facts, ("missing", "unexpected")) if ev.get(key)],
        )
    if invariant == "correctness" and "request" in ev:
        return AnomalyText(
            f"request {ev['request']} was answered differently from the no-cache reference, from token "
            f"{ev.get('first_diff_at')} on",
            f"symptom: expected tokens {_tokens(ev.get('expected'))}, got {_tokens(ev.get('got'))}",
            [f"{ev['mismatched']} answer(s) differ in all"] if ev.get("mismatched") else [],
        )
    if invariant == "metrics" and "metrics" in ev and "responses" in ev:
        return AnomalyText(
            f"{_words(ev.get('what'))}: /metrics counts {_words(ev['metrics'])}, the answers {_words(ev['responses'])}",
            "",
            [],
        )
    if invariant == "accounting" and "problems" in ev:
        return AnomalyText(f"rank {ev.get('rank')} at quiesce: {_words(ev['problems'])}", "", [])
    # any other evidence: its own words first ("what"), then one fact a line
    lead = str(ev.get("what") or ev.get("note") or invariant or "anomaly")
    facts = [
        _clip(f"{key}: {_words(value)}")
        for key, value in ev.items()
        if key not in ("what", "note", "record") and value not in (None, "", [], {})
    ]
    return AnomalyText(lead, "", facts)


FACT_CHARS = 600  # one fact a line: every rank's status line of a big job is in history.jsonl


def _clip(text: str) -> str:
    return text if len(text) <= FACT_CHARS else text[: FACT_CHARS - 1] + "…"


def _words(value) -> str:
    """A value of the evidence as text: lists joined, mappings as `key value`, nothing as a dash."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_words(v) for v in value) or "-"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_words(v)}" for k, v in value.items()) or "-"
    return str(value)


def _tokens(ids) -> str:
    return " ".join(map(str, ids)) if isinstance(ids, list) else _words(ids)


def _quoted(lines) -> str:
    return (", ".join(f"'{line}'" for line in lines) or "-") if isinstance(lines, list) else _words(lines)


def fault_specs(faults) -> list[str]:
    """The faults of a JSON report as they are typed for --inject (`kind:key=value,...`)."""
    return [fault_spec(f) for f in faults] if isinstance(faults, list) else []


def fault_spec(fault) -> str:
    from hctool.protocol.faults import Fault

    if isinstance(fault, str):
        return fault
    try:
        return Fault.from_dict(fault).spec()
    except (ValueError, TypeError, KeyError):  # a report of another hctool: the same form, unchecked
        if not isinstance(fault, dict):
            return str(fault)
        rest = ",".join(f"{k}={v}" for k, v in fault.items() if k != "kind" and v is not None)
        return f"{fault.get('kind')}:{rest}" if rest else str(fault.get("kind"))


_RATE = re.compile(r"^(\d+)/(\d+)$")


def rate_words(reproduced) -> str:
    """`9/10` as `9 of 10 runs` (a replay's runs, or `chaos run --runs`)."""
    m = _RATE.match(str(reproduced))
    return f"{m.group(1)} of {m.group(2)} run{'s' if m.group(2) != '1' else ''}" if m else str(reproduced)


_ANY_RANK = re.compile(r"(?<=[:,])(?:target=one|rank=\d+)(?=,|$)")


def failing_run(report: dict, anomaly: dict) -> dict | None:
    """The run whose schedule found this anomaly: the one explore names in the anomaly's `run`;
    else (older reports, `chaos run`) where the same invariant failed with the same faults. Before
    shrinking, `target=one` was resolved to the rank it picks, so a fault matches with either;
    else the first run where that invariant failed."""
    want = fault_specs(anomaly.get("schedule"))
    runs = [r for r in report.get("runs") or [] if isinstance(r, dict)]
    named = [r for r in runs if anomaly.get("run") and r.get("name") == anomaly.get("run")]
    if named:
        return named[0]
    found = [r for r in runs if anomaly.get("invariant") in (r.get("invariants") or [])]

    def loose(specs) -> list[str]:
        return [_ANY_RANK.sub("rank=?", str(spec)) for spec in specs or []]

    return next(
        (r for r in found if list(r.get("schedule") or []) == want),
        next((r for r in found if loose(r.get("schedule")) == loose(want)), found[0] if found else None),
    )


def anomaly_lines(anomaly: dict) -> list[tuple[str, str | list[str]]]:
    """What follows an anomaly's cause and symptom, as (label, text or fault specs): the schedule
    that found it, the shrunk one, the steps the replay backed off along, how often the replay
    reproduced it, the replay command."""
    out: list[tuple[str, str | list[str]]] = []
    specs = fault_specs(anomaly.get("schedule"))
    if specs:
        out.append(("schedule", specs))
    if anomaly.get("shrunk") is not None:
        shrunk = fault_specs(anomaly["shrunk"])
        out.append((f"shrunk to {len(shrunk)} fault(s)", shrunk))
    replayed = anomaly.get("replayed")
    for step in replayed if isinstance(replayed, list) else []:
        if isinstance(step, dict):
            out.append((f"replayed, {rate_words(step.get('reproduced'))}", fault_specs(step.get("schedule"))))
    if anomaly.get("reproduced"):
        out.append(("reproduced", rate_words(anomaly["reproduced"])))
    if anomaly.get("replay"):
        out.append(("replay", str(anomaly["replay"])))
    return out


def render(report: dict, console) -> None:
    """The human output: the verdict, the schedules run, each anomaly in sentences."""
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
            seconds = r.get("seconds")
            table.add_row(
                _words(r.get("name")),
                "\n".join(map(str, r.get("schedule") or [])) or "-",
                _words(r.get("verdict")),
                ", ".join(map(str, r.get("invariants") or [])) or "-",
                f"{seconds:.0f}" if isinstance(seconds, (int, float)) else "-",
            )
        console.print(table)
    for i, a in enumerate(report["anomalies"], 1):
        run = failing_run(report, a)
        found_by = f", found by run {run['name']}" if run and run.get("name") else ""
        console.print(Text(f"\nanomaly {i}: {a['invariant']}{found_by}", style="bold red"))
        said = describe(a)
        console.print(Text(said.cause, style="bold"), soft_wrap=True)
        if said.symptom:
            console.print(Text(said.symptom), soft_wrap=True)
        for fact in said.facts:  # under the sentences they support
            console.print(Text(f"  {fact}", style="dim"), soft_wrap=True)
        for label, value in anomaly_lines(a):
            text = value if isinstance(value, str) else "; ".join(value) or "-"
            console.print(Text(f"{label}: {text}", style="bold" if label == "replay" else ""), soft_wrap=True)
    if report.get("history"):
        console.print(Text(f"history: {short_path(str(report['history']))}"))
