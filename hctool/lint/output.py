"""Output formats: text (rich), json (docs/contracts.md), sarif 2.1.0, github annotations."""

from __future__ import annotations

import json
from pathlib import Path

from hctool import __version__
from hctool.lint.rules import ALL_CODES, RULES
from hctool.lint.runner import Report

FORMATS = ("text", "json", "sarif", "github")
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _rel(path: str, report: Report) -> str:
    """Repository-relative URI: relative to the git root (or cwd) when the file lies under it."""
    p = Path(path)
    absolute = p if p.is_absolute() else (Path.cwd() / p)
    try:
        return absolute.resolve().relative_to(report.root).as_posix()
    except ValueError:
        return absolute.as_posix()


def to_json(report: Report) -> list[dict]:
    return [
        {
            "rule": f.rule,
            "name": RULES[f.rule].name,
            "path": f.path,
            "line": f.line,
            "col": f.col,
            "severity": f.severity,
            "premise": f.premise,
            "count": f.count,
            "message": f.message,
            "related": [{"path": r.path, "line": r.line, "message": r.message, "role": r.role} for r in f.related],
        }
        for f in report.findings
    ]


LEVEL = {"high": "error", "medium": "warning", "low": "note"}


def to_sarif(report: Report) -> dict:
    rules = [
        {
            "id": code,
            "name": RULES[code].name,
            "shortDescription": {"text": RULES[code].summary},
            "fullDescription": {"text": RULES[code].summary},
            "help": {"text": RULES[code].help},
            "helpUri": "https://github.com/hctool/hctool/blob/main/docs/lint.md#" + code.lower(),
            "defaultConfiguration": {"level": "note" if code == "HC100" else "warning"},
        }
        for code in ALL_CODES
    ]
    index = {code: i for i, code in enumerate(ALL_CODES)}

    def location(path: str, line: int, col: int | None = None, message: str | None = None, ident=None) -> dict:
        region = {"startLine": line}
        if col:
            region["startColumn"] = col
        loc = {
            "physicalLocation": {
                "artifactLocation": {"uri": _rel(path, report), "uriBaseId": "%SRCROOT%"},
                "region": region,
            }
        }
        if message:
            loc["message"] = {"text": message}
        if ident is not None:
            loc["id"] = ident
        return loc

    results = [
        {
            "ruleId": f.rule,
            "ruleIndex": index[f.rule],
            "level": LEVEL[f.severity],
            "message": {"text": f.message},
            "locations": [location(f.path, f.line, f.col)],
            "relatedLocations": [location(r.path, r.line, None, r.message, i) for i, r in enumerate(f.related)],
            "partialFingerprints": {"hctool/v1": f"{f.rule}:{_rel(f.path, report)}:{f.line}:{f.col}"},
            "properties": {"severity": f.severity, "premise": f.premise, "count": f.count},
        }
        for f in report.findings
    ]
    notifications = [
        {"level": "error", "message": {"text": e.message}, "locations": [location(e.path, e.line)]}
        for e in report.errors
    ]
    return {
        "version": "2.1.0",
        "$schema": SARIF_SCHEMA,
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "hctool",
                        "version": __version__,
                        "semanticVersion": __version__,
                        "informationUri": "https://github.com/hctool/hctool",
                        "rules": rules,
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": report.root.as_uri() + "/"}},
                "results": results,
                "invocations": [
                    {"executionSuccessful": not report.errors, "toolExecutionNotifications": notifications}
                ],
            }
        ],
    }


def _gh_escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def to_github(report: Report) -> str:
    lines = []
    for f in report.findings:
        title = _gh_escape(f"{f.rule} {RULES[f.rule].name}", prop=True)
        kind = {"high": "error", "medium": "warning"}.get(f.severity, "notice")
        lines.append(
            f"::{kind} file={_gh_escape(f.path, True)},line={f.line},col={f.col},title={title}::{_gh_escape(f.message)}"
        )
    for e in report.errors:
        lines.append(
            f"::error file={_gh_escape(e.path, True)},line={e.line},title=hctool lint::{_gh_escape(e.message)}"
        )
    return "\n".join(lines)


def print_text(report: Report, console, statistics: bool, quiet: bool = False) -> None:
    """Human output on CONSOLE (stdout), as ruff prints: one line per finding,
    `path:line:col: CODE [severity] message` (what editors' and CI problem matchers read as
    `%f:%l:%c: %m`), its related lines indented below it, then a summary (not with QUIET).
    With STATISTICS only the counts per rule are printed."""
    from rich.markup import escape

    if statistics:
        counts: dict[str, int] = {}
        for f in report.findings:
            counts[f.rule] = counts.get(f.rule, 0) + 1
        for code in sorted(counts):
            console.print(f"{counts[code]:6d}  {code}  {RULES[code].name}", highlight=False)
    else:
        for f in report.findings:
            color = {"high": "red", "medium": "yellow"}.get(f.severity, "blue")
            console.print(
                f"[bold]{escape(f.path)}:{f.line}:{f.col}:[/bold] [{color}]{f.rule}[/{color}] "
                f"[dim]\\[{f.severity}][/dim] {escape(f.message)}",
                highlight=False,
                soft_wrap=True,
            )
            for r in f.related:
                console.print(
                    f"    [cyan]{escape(r.path)}:{r.line}:[/cyan] {escape(r.message)}", highlight=False, soft_wrap=True
                )
    for e in report.errors:
        console.print(
            f"[bold]{escape(e.path)}:{e.line}:1:[/bold] [red]error[/red] {escape(e.message)}",
            highlight=False,
            soft_wrap=True,
        )
    if quiet or statistics:
        return
    noun = "finding" if len(report.findings) == 1 else "findings"
    files = "file" if report.files == 1 else "files"
    console.print(
        f"{len(report.findings)} {noun} in {report.files} {files} ({report.lines} lines, "
        f"{report.seconds:.2f}s)" + (f", {len(report.errors)} file(s) not analyzed" if report.errors else ""),
        highlight=False,
    )


def render(report: Report, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(to_json(report), indent=2)
    if fmt == "sarif":
        return json.dumps(to_sarif(report), indent=2)
    return to_github(report)
