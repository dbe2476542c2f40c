"""What the gate writes: JUnit XML (the common Ant/Jenkins schema that GitHub's
and GitLab's test views read), SARIF 2.1.0 (lint's own), GitHub workflow
annotations and step summary, and a rich table for a terminal."""

from __future__ import annotations

import json
import re
import socket
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

from hctool import __version__
from hctool.gate.steps import ERROR, FAILED, PASSED, SKIPPED, StepResult

# XML 1.0 allows only these characters: a rank's log, a test's name or a file's name can hold
# any byte (a control character, or a lone surrogate for a name that is not UTF-8), and one of
# them made the whole file not well-formed. Each is written as its escape (\x01, \udcff).
_XML_BAD = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _clean(text) -> str:
    return _XML_BAD.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def write_junit(steps: list[StepResult], path: Path) -> None:
    stamp = datetime.now(UTC).replace(tzinfo=None, microsecond=0).isoformat()
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    root = ET.Element("testsuites", name="hctool gate")
    for i, step in enumerate(steps):
        counts = {
            "tests": len(step.cases),
            "failures": sum(c.status == FAILED for c in step.cases),
            "errors": sum(c.status == ERROR for c in step.cases),
            "skipped": sum(c.status == SKIPPED for c in step.cases),
        }
        suite = ET.SubElement(
            root,
            "testsuite",
            name=_clean(step.name),
            id=str(i),
            package="hctool.gate",
            timestamp=stamp,
            hostname=socket.gethostname(),
            time=f"{step.seconds:.3f}",
            **{k: str(v) for k, v in counts.items()},
        )
        ET.SubElement(ET.SubElement(suite, "properties"), "property", name="summary", value=_clean(step.summary))
        for case in step.cases:
            attrs = {"name": _clean(case.name), "classname": _clean(case.classname), "time": f"{case.seconds:.3f}"}
            if case.file:
                attrs["file"] = _clean(case.file)
            if case.line:
                attrs["line"] = str(case.line)
            tc = ET.SubElement(suite, "testcase", attrs)
            tag = {FAILED: "failure", ERROR: "error", SKIPPED: "skipped"}.get(case.status)
            if tag:
                el = ET.SubElement(tc, tag, message=_clean(case.message[:1000]))
                if tag != "skipped":
                    el.set("type", f"hctool.{step.name}")
                    el.text = _clean(case.text or case.message)
            elif case.text:
                ET.SubElement(tc, "system-out").text = _clean(case.text)
        ET.SubElement(suite, "system-out")
        ET.SubElement(suite, "system-err")
        for k in totals:
            totals[k] += counts[k]
    root.set("time", f"{sum(s.seconds for s in steps):.3f}")
    for k, v in totals.items():
        root.set(k, str(v))
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="UTF-8", xml_declaration=True)


def write_sarif(steps: list[StepResult], path: Path) -> None:
    """Lint's SARIF as it came; without a lint step, a valid empty run (code scanning
    uploads can then run unconditionally and clear earlier alerts)."""
    sarif = next((s.sarif for s in steps if s.sarif is not None), None)
    if sarif is None:
        sarif = {
            "version": "2.1.0",
            "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
            "runs": [{"tool": {"driver": {"name": "hctool", "version": __version__}}, "results": []}],
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sarif, indent=2) + "\n")


def _esc(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def github_annotations(steps: list[StepResult]) -> list[str]:
    """Workflow commands: one ::error per failed or broken case, at its file and line if known."""
    lines = []
    for step in steps:
        for c in step.cases:
            if c.status not in (FAILED, ERROR):
                continue
            props = [f"title={_esc(f'hctool gate {step.name}: {c.name}', True)}"]
            if c.file:
                props.insert(0, f"file={_esc(c.file, True)}")
                if c.line:
                    props.insert(1, f"line={c.line}")
            body = c.message if step.name == "lint" else _message_and_text(c)
            lines.append(f"::error {','.join(props)}::{_esc(body[:4000])}")
    return lines


def _message_and_text(case) -> str:
    """A failed test's message is the first line of its text (the plugin's cause line): once."""
    if case.message and case.text.startswith(case.message):
        return case.text.strip()
    return (case.message + "\n" + case.text).strip()


def _head(case, lines: int = 4) -> list[str]:
    """What a summary shows of a failed case: its message, and where the text goes on from the
    message (a multi-rank test: the symptom and each rank's call), its next lines."""
    text = case.text if case.message and case.text.startswith(case.message) else case.message
    return text.splitlines()[:lines]


def _md_line(text: str) -> str:
    return " ".join(text.split("\n")).replace("`", "'")


def markdown_summary(steps: list[StepResult], code: int, shown: int = 10) -> str:
    """The step table, then each failed or broken case's message (the cause of a multi-rank
    test's failure), so the job's summary page answers without opening the log."""
    icon = {PASSED: "✅", FAILED: "❌", ERROR: "⚠️", SKIPPED: "➖"}
    rows = "\n".join(f"| {s.name} | {icon[s.status]} {s.status} | {s.summary} | {s.seconds:.1f} s |" for s in steps)
    out = f"### hctool gate: exit {code}\n\n| step | result | summary | time |\n|---|---|---|---|\n{rows}\n"
    bad = [(s, c) for s in steps for c in s.cases if c.status in (FAILED, ERROR)]
    if bad:
        items = [f"- {icon[c.status]} {s.name}: `{_md_line(c.name)}`: {_md_line(c.message)}" for s, c in bad[:shown]]
        if len(bad) > shown:
            items.append(f"- and {len(bad) - shown} more (the JUnit file has them all)")
        out += "\n" + "\n".join(items) + "\n"
    return out


def print_table(steps: list[StepResult], code: int, console) -> None:
    from rich.table import Table
    from rich.text import Text

    style = {PASSED: "green", FAILED: "red", ERROR: "yellow", SKIPPED: "dim"}
    table = Table(title=f"hctool gate: exit {code}")
    for col in ("step", "result", "summary", "time"):
        table.add_column(col, overflow="fold")
    for s in steps:
        table.add_row(s.name, Text(s.status, style[s.status]), Text(s.summary), f"{s.seconds:.1f} s")
    console.print(table)
    for s in steps:  # names hold brackets (test ids), so Text, never markup
        for c in s.cases:
            if c.status in (FAILED, ERROR):
                msg = "\n".join(_head(c))  # the cause, the symptom, each rank's call; the rest is in JUnit
                console.print(Text.assemble((f"{s.name}: {c.name}", style[c.status]), f"  {msg}"))
