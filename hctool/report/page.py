"""The report page: a header with the verdict, the runner's own table (repro's
variants, chaos's runs, anomalies and schedules), then each traced run
(runview.py). One file, inline style and script, nothing fetched."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from hctool import __version__
from hctool.consensus.marks import run_marks
from hctool.consensus.timeline import collect, default_limit
from hctool.console import log
from hctool.console.paths import short_path
from hctool.report import assets
from hctool.report.folders import Folder, analysis, ended_at, identify, interesting, traced_runs
from hctool.report.runview import headline, run_section, verdict_badge
from hctool.report.svg import esc

if TYPE_CHECKING:
    from hctool.consensus.model import Report

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
        seed = "" if doc.get("seed") is None else f"seed {doc['seed']}, "
        return f"chaos {doc.get('target') or ''} ({seed}{doc.get('schedules') or 0} schedule(s))"
    if folder.kind == "repro-all":
        return f"repro all ({len(doc.get('incidents', []))} incident(s))"
    return "check-consensus run" if folder.kind == "consensus" else folder.kind


def _cell(value) -> str:
    """A table cell's text: an absent value is a dash (never `None`), a float without noise."""
    if value is None or value == "":
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _table(cols: list[str], rows: list[list], cls: str = "") -> str:
    """Cells are text, escaped here; a cell given as Html is markup made by this module."""
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{v if isinstance(v, Html) else esc(_cell(v))}</td>" for v in row) + "</tr>"
        for row in rows
    )
    return f'<table class="{esc(cls)}"><tr>{head}</tr>{body}</table>'


class Html(str):
    """Markup this module made (escaped already): a table cell that holds a link."""


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name)


def _in_folder(root: Path, given) -> str:
    """A path a runner recorded (absolute, or relative to where it ran) as the page names it:
    relative to the run folder where it lies in it (the page is that folder's), else as the user
    would open it from here (console.paths.short_path); a dash for none."""
    if not isinstance(given, str) or not given:
        return "-"
    base = root.resolve()
    for cand in (Path(given), root / Path(given).name):
        if cand.exists():
            try:
                return cand.resolve().relative_to(base).as_posix()
            except ValueError:
                continue
    return short_path(given)


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
    return ""


def _chaos_sections(folder: Folder, sections: dict[str, tuple[str, Report]]) -> list[str]:
    """A chaos page: each anomaly in sentences, followed by the run that found it drawn whole
    (its calls aligned by sequence number, its timeline: runview's, as check-consensus draws a
    run); then the table of every schedule run and the other runs drawn."""
    from hctool.chaos.report import anomaly_lines, describe, failing_run

    doc = folder.doc or {}
    out, placed = [], set()
    for i, a in enumerate(doc.get("anomalies") or [], 1):
        run = failing_run(doc, a)
        name = str(run.get("name")) if run else None
        said = describe(a)
        found_by = ""
        if name in sections:
            found_by = f' <span class="dim">found by run <a href="#run-{esc(_slug(name))}">{esc(name)}</a></span>'
        elif name:
            found_by = f' <span class="dim">found by run {esc(name)} (no traces to draw)</span>'
        parts = [
            f'<section class="anomaly" id="anomaly-{i}"><h2>Anomaly {i}: {esc(a.get("invariant"))}{found_by}</h2>',
            f'<p class="cause">{esc(said.cause)}</p>',
        ]
        if said.symptom:
            parts.append(f'<p class="symptom">{esc(said.symptom)}</p>')
        parts += [f'<p class="dim fact">{esc(fact)}</p>' for fact in said.facts]
        rows = []
        for label, value in anomaly_lines(a):
            if isinstance(value, str):
                cell = f"<code>{esc(value)}</code>" if label == "replay" else esc(value)
            else:  # fault specs, one a line, as they are typed for --inject
                cell = "<br>".join(f"<code>{esc(spec)}</code>" for spec in value) or "-"
            rows.append(f'<tr><th>{esc(label)}</th><td class="{esc(label.split()[0])}">{cell}</td></tr>')
        if rows:
            parts.append(f'<table class="anomaly-facts">{"".join(rows)}</table>')
        parts.append("</section>")
        out.append("\n".join(parts))
        if name in sections and name not in placed:
            placed.add(name)
            out.append(sections[name][0])
    out.append(_runs_table(folder, sections))
    out += [html for name, (html, _) in sections.items() if name not in placed]
    return out


def _runs_table(folder: Folder, sections: dict) -> str:
    """Every schedule run: its faults as typed for --inject, its verdict, its folder (a link to
    its drawing where the page draws it)."""
    doc, root = folder.doc or {}, folder.path
    rows = []
    for r in doc.get("runs") or []:
        name = str(r.get("name"))
        rows.append(
            [
                Html(f'<a href="#run-{esc(_slug(name))}">{esc(name)}</a>') if name in sections else name,
                Html("<br>".join(f"<code>{esc(spec)}</code>" for spec in r.get("schedule") or []) or "-"),
                r.get("verdict"),
                ", ".join(r.get("invariants") or []),
                r.get("seconds"),
                _in_folder(root, r.get("artifacts")),
            ]
        )
    history = f'<p class="dim">history: <code>{esc(_in_folder(root, doc.get("history")))}</code></p>'
    return (
        "<section><h2>Schedules run</h2>"
        + _table(["run", "schedule", "verdict", "invariants", "seconds", "folder"], rows, "runs")
        + (history if doc.get("history") else "")
        + "</section>"
    )


def _said_above(folder: Folder, name: str) -> frozenset[str]:
    """The cause and symptom lines an anomaly of this run already gives above its drawing."""
    if folder.kind != "chaos":
        return frozenset()
    from hctool.chaos.report import describe, failing_run

    doc = folder.doc or {}
    return frozenset(
        line
        for a in doc.get("anomalies") or []
        if (failing_run(doc, a) or {}).get("name") == name
        for line in describe(a)[:2]
    )


def _folder_name(path: Path) -> str:
    """The run folder as the page names it: from where hctool ran, else by its own name."""
    shown = short_path(str(path.resolve()))
    return path.name if shown.startswith("/") else shown


def build(path: Path, document: dict | None = None) -> str:
    folder = identify(path, document)
    runs = traced_runs(folder)
    if folder.kind in ("consensus", "flight-recorder") and document:
        runs[0].doc = document  # the hook's report: it has the stacks a folder does not keep
    shown = sorted(runs, key=lambda r: not interesting(r))[:MAX_RUNS] if folder.kind == "chaos" else runs[:MAX_RUNS]
    sections: dict[str, tuple[str, Report]] = {}
    for run in shown:
        report = analysis(run)
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
        sections[run.name] = (run_section(run.name, report, tl, marks, extra, _said_above(folder, run.name)), report)
    reports = [report for _, report in sections.values()]
    left = len(runs) - len(shown)
    verdict = _verdict(folder, reports)
    summary = headline(reports[0]) if reports and folder.kind in ("consensus", "flight-recorder", "run") else ""
    nav = " ".join(f'<a href="#run-{esc(_slug(r.name))}">{esc(r.name)}</a>' for r in shown)
    body = _chaos_sections(folder, sections) if folder.kind == "chaos" else [html for html, _ in sections.values()]
    page = "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>hctool report: {esc(_title(folder))}</title><style>{assets.CSS}</style></head><body>",
            f"<header><h1>{esc(_title(folder))}</h1><div>verdict: {verdict_badge(verdict, 'verdict')}</div>",
            f'<p class="headline" id="summary">{esc(summary)}</p>' if summary else "",
            f'<p class="sub">{esc(_folder_name(folder.path))} · made {esc(time.strftime("%Y-%m-%d %H:%M:%S"))} by '
            f"hctool {esc(__version__)}"
            + (f" · {left} more run(s) with traces not drawn" if left > 0 else "")
            + "</p>",
            f"<nav>{nav}</nav></header>" if len(shown) > 1 else "</header>",
            _runner_section(folder),
            *body,
            '<div id="detail"></div>',
            f"<script>{assets.JS}</script>",
            "</body></html>",
            "",
        ]
    )
    # A name that is not UTF-8 (a script, a folder) reaches here as a lone surrogate
    # (surrogateescape) and made encoding the page fail: the report was lost. Shown as \udcff.
    return page.encode("utf-8", "backslashreplace").decode("utf-8")
