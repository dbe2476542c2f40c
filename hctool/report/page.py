"""The report page: a header with the verdict, the runner's own table (repro's
variants, chaos's runs, anomalies and schedules), then each traced run
(runview.py). One file, inline style and script, nothing fetched."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hctool import __version__
from hctool.consensus.marks import run_marks
from hctool.consensus.timeline import collect, default_limit
from hctool.console import log
from hctool.report import assets
from hctool.report.folders import Folder, analysis, ended_at, identify, interesting, traced_runs
from hctool.report.runview import headline, run_section, verdict_badge
from hctool.report.svg import esc

PAGE_CALLS = 24_000  # calls drawn over all ranks of one run (the SVG stays light in a browser)
MAX_RUNS = 8  # traced runs drawn in full; the others stay rows of the table


def _verdict(folder: Folder, reports: list) -> str:
    doc = folder.doc or {}
    if folder.kind == "chaos":
        return doc.get("verdict")
    if folder.kind in ("repro", "repro-all"):
        variants = doc.get("variants") or [v for i in doc.get("incidents", []) for v in i.get("variants", [])]
        return "as expected" if variants and all(v.get("ok") for v in variants) else "not as expected"
    if reports:
        return reports[0].extra.get("runner_verdict") or reports[0].verdict.value
    return None


def _title(folder: Folder) -> str:
    doc = folder.doc or {}
    if folder.kind == "repro":
        return f"repro {doc.get('id')}: {doc.get('title')}"
    if folder.kind == "chaos":
        return f"chaos {doc.get('target')} (seed {doc.get('seed')}, {doc.get('schedules')} schedule(s))"
    if folder.kind == "repro-all":
        return f"repro all ({len(doc.get('incidents', []))} incident(s))"
    return "check-consensus run" if folder.kind == "consensus" else folder.kind


def _table(cols: list[str], rows: list[list], cls: str = "") -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f'<table class="{esc(cls)}"><tr>{head}</tr>{body}</table>'


def _variant_rows(variants: list[dict]) -> list[list]:
    out = []
    for v in variants:
        req = v.get("requests") or {}
        m = v.get("mechanism")
        first = v.get("first_divergence")
        out.append(
            [
                v.get("name"),
                " | ".join(v.get("expected", [])),
                v.get("verdict"),
                "yes" if v.get("ok") else "NO",
                "-" if not m else ("seen" if m.get("seen") else "NOT seen"),
                f"{req.get('succeeded', '?')}/{req.get('sent', '?')}",
                v.get("seconds"),
                _cause_text(first),
            ]
        )
    return out


def _cause_text(first) -> str:
    """A variant's or a run's first divergence (a document from its report.json), as its cause line."""
    from hctool.consensus.model import Divergence, ReportError

    if not first:
        return "-"
    try:
        return Divergence.from_json(first).cause_line()
    except ReportError:
        return "(not a first divergence this hctool reads)"


def _runner_section(folder: Folder) -> str:
    doc = folder.doc or {}
    if folder.kind == "repro":
        return (
            "<section><h2>Variants</h2>"
            + _table(
                [
                    "variant",
                    "expected",
                    "verdict",
                    "ok",
                    "mechanism",
                    "requests answered",
                    "seconds",
                    "first divergence",
                ],
                _variant_rows(doc["variants"]),
                "variants",
            )
            + "</section>"
        )
    if folder.kind == "repro-all":
        rows = [[i.get("id"), *row] for i in doc["incidents"] for row in _variant_rows(i.get("variants", []))]
        return (
            "<section><h2>Incidents</h2>"
            + _table(
                [
                    "incident",
                    "variant",
                    "expected",
                    "verdict",
                    "ok",
                    "mechanism",
                    "requests answered",
                    "seconds",
                    "first divergence",
                ],
                rows,
                "variants",
            )
            + "</section>"
        )
    if folder.kind != "chaos":
        return ""
    parts = [
        "<section><h2>Schedules run</h2>",
        _table(
            ["run", "schedule", "verdict", "invariants", "seconds"],
            [
                [
                    r.get("name"),
                    "; ".join(r.get("schedule") or []) or "-",
                    r.get("verdict"),
                    ", ".join(r.get("invariants") or []) or "-",
                    r.get("seconds"),
                ]
                for r in doc["runs"]
            ],
            "runs",
        ),
    ]
    for i, a in enumerate(doc.get("anomalies") or [], 1):
        parts.append(f"<h3>Anomaly {i}: {esc(a.get('invariant'))}</h3>")
        for label, key in (("schedule", "schedule"), ("shrunk to", "shrunk")):
            faults = a.get(key)
            if faults:
                cols = ["kind", "target", "ms", "p", "start_s", "duration_s", "n"]
                parts.append(
                    f"<p>{esc(label)}:</p>"
                    + _table(cols, [[f.get(c) for c in cols] for f in faults if isinstance(f, dict)], "schedule")
                )
        if a.get("reproduced"):
            parts.append(f"<p>reproduced {esc(a['reproduced'])}</p>")
        parts.append(
            f"<p>replay: <code>{esc(a.get('replay'))}</code></p>"
            f"<pre>{esc(json.dumps(a.get('evidence'), indent=1, default=str)[:4000])}</pre>"
        )
    parts.append(f'<p class="dim">history: {esc(doc.get("history"))}</p></section>')
    return "\n".join(parts)


def build(path: Path, document: dict | None = None) -> str:
    folder = identify(path, document)
    runs = traced_runs(folder)
    if folder.kind in ("consensus", "flight-recorder") and document:
        runs[0].doc = document  # the hook's report: it has the stacks a folder does not keep
    shown = sorted(runs, key=lambda r: not interesting(r))[:MAX_RUNS] if folder.kind == "chaos" else runs[:MAX_RUNS]
    sections, reports = [], []
    for run in shown:
        report = analysis(run)
        reports.append(report)
        world = max(1, int(report.world_size or 1))
        tl = collect(
            run.trace_dir, report.first_divergence, min(default_limit(world), PAGE_CALLS // world), ended_at(run)
        )
        extra = ""
        if run.doc.get("reason"):
            extra = f'<p class="dim">{esc(run.doc["reason"])}</p>'
        if folder.kind == "chaos" and run.doc.get("schedule"):
            extra += f"<p>schedule: <code>{esc('; '.join(run.doc['schedule']))}</code></p>"
        marks = run_marks(run.run_dir, tl.headers)
        log.debug(
            f"hctool: report: {run.name}: {sum(map(len, tl.calls.values()))} of {sum(tl.seen.values())} calls "
            f"drawn (stride {tl.stride}), {len(marks)} marks"
        )
        sections.append(run_section(run.name, report, tl, marks, extra))
    left = len(runs) - len(shown)
    verdict = _verdict(folder, reports)
    summary = headline(reports[0]) if reports and folder.kind in ("consensus", "flight-recorder", "run") else ""
    nav = " ".join(
        f'<a href="#run-{esc("".join(ch if ch.isalnum() else "-" for ch in r.name))}">{esc(r.name)}</a>' for r in shown
    )
    page = "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>hctool report: {esc(_title(folder))}</title><style>{assets.CSS}</style></head><body>",
            f"<header><h1>{esc(_title(folder))}</h1><div>verdict: {verdict_badge(verdict, 'verdict')}</div>",
            f'<p class="headline" id="summary">{esc(summary)}</p>' if summary else "",
            f'<p class="sub">{esc(folder.path)} · made {esc(time.strftime("%Y-%m-%d %H:%M:%S"))} by '
            f"hctool {esc(__version__)}"
            + (f" · {left} more run(s) with traces not drawn" if left > 0 else "")
            + "</p>",
            f"<nav>{nav}</nav></header>" if len(shown) > 1 else "</header>",
            _runner_section(folder),
            *sections,
            '<div id="detail"></div>',
            f"<script>{assets.JS}</script>",
            "</body></html>",
            "",
        ]
    )
    # A name that is not UTF-8 (a script, a folder) reaches here as a lone surrogate
    # (surrogateescape) and made encoding the page fail: the report was lost. Shown as \udcff.
    return page.encode("utf-8", "backslashreplace").decode("utf-8")
