"""The gate's steps. Each runs the user-facing command (hctool lint, pytest with
the plugin, hctool repro, hctool chaos explore) and turns its machine output
into cases: one per lint finding, test, repro variant or chaos anomaly."""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

from hctool.consensus.report import counts_line
from hctool.gate.config import GateConfig
from hctool.gate.run import Proc, python_hctool, run_command, tail
from hctool.protocol.safefile import read_regular

PASSED, FAILED, ERROR, SKIPPED = "passed", "failed", "error", "skipped"


class Case(NamedTuple):
    name: str
    classname: str
    status: str
    message: str = ""
    text: str = ""
    seconds: float = 0.0
    file: str | None = None
    line: int | None = None


class StepResult(NamedTuple):
    name: str
    status: str
    seconds: float
    cases: list[Case]
    summary: str
    sarif: dict | None = None


def _status(cases: list[Case]) -> str:
    states = {c.status for c in cases}
    return ERROR if ERROR in states else FAILED if FAILED in states else PASSED if PASSED in states else SKIPPED


def _reason(text: str) -> str:
    """The line that says why: an `Error: ...` line, else the last line with words
    (typer's usage errors come boxed in rich's frame characters)."""
    lines = [ln.strip(" \t│╭╮╰╯─") for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    return (errors or lines or ["no output"])[-1][:300]


def _could_not_run(step: str, proc: Proc, what: str) -> Case:
    if proc.code is None:
        return Case(
            what,
            step,
            ERROR,
            f"deadline passed after {proc.seconds:.0f} s; every process was ended",
            tail(proc.stderr, 30),
            proc.seconds,
        )
    return Case(
        what,
        step,
        ERROR,
        f"could not run (exit {proc.code}): {_reason(proc.stderr or proc.stdout)}",
        tail(proc.stderr + "\n" + proc.stdout, 30),
        proc.seconds,
    )


def lint_step(cfg: GateConfig, work: Path, changed_since: str | None, deadline: float) -> StepResult:
    cmd = python_hctool("lint", *cfg.lint, "--format", "sarif")
    if cfg.lint_baseline:
        cmd += ["--baseline", cfg.lint_baseline]
    if changed_since:
        cmd += ["--diff", changed_since]
    proc = run_command(cmd, cfg.root, deadline, work, "lint")
    try:
        sarif = json.loads(proc.stdout) if proc.code in (0, 1, 2) else None
    except json.JSONDecodeError:
        sarif = None
    if sarif is None:
        case = _could_not_run("lint", proc, "hctool lint " + " ".join(cfg.lint))
        return StepResult("lint", ERROR, proc.seconds, [case], f"{case.name}: {case.message}")
    cases = [_finding_case(r) for run in sarif.get("runs", []) for r in run.get("results", [])]
    if proc.code == 2:  # some file could not be analyzed; the findings of the others still count
        cases.append(
            Case(
                "analysis errors",
                "lint",
                ERROR,
                "hctool lint could not analyze some files",
                tail(proc.stderr, 30),
                proc.seconds,
            )
        )
    if not cases:
        cases = [Case(f"lint {p}", "lint", PASSED, seconds=proc.seconds) for p in cfg.lint]
    scope = f" (lines changed since {changed_since})" if changed_since else ""
    summary = f"{sum(c.status == FAILED for c in cases)} finding(s) in {', '.join(cfg.lint)}{scope}"
    return StepResult("lint", _status(cases), proc.seconds, cases, summary, sarif)


def _finding_case(result: dict) -> Case:
    def where(loc: dict) -> tuple[str, int]:
        phys = loc.get("physicalLocation", {})
        return phys.get("artifactLocation", {}).get("uri", "?"), phys.get("region", {}).get("startLine", 1)

    path, line = where((result.get("locations") or [{}])[0])
    msg = result.get("message", {}).get("text", "")
    related = "\n".join(
        f"  {p}:{n}: {loc.get('message', {}).get('text', '')}"
        for loc in result.get("relatedLocations", [])
        for p, n in [where(loc)]
    )
    rule = result.get("ruleId", "lint")
    return Case(
        f"{rule} {path}:{line}",
        f"lint.{rule}",
        FAILED,
        msg,
        f"{path}:{line}: {msg}\n{related}".rstrip(),
        file=path,
        line=line,
    )


def tests_step(cfg: GateConfig, work: Path, deadline: float) -> StepResult:
    xml_path = (work / "pytest-junit.xml").resolve()
    xml_path.unlink(missing_ok=True)
    # xunit1 keeps file and line on each test case, which annotations and GitLab's view use.
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *cfg.tests,
        "-p",
        "hctool.pytest_plugin",
        f"--junitxml={xml_path}",
        "-o",
        "junit_family=xunit1",
        "-q",
        *cfg.pytest_args,
    ]
    proc = run_command(cmd, cfg.root, deadline, work, "tests")
    cases = _pytest_cases(xml_path) if xml_path.exists() else []
    if proc.code not in (0, 1) or not cases:
        why = "no tests collected" if proc.code == 5 else None
        case = _could_not_run("tests", proc, "pytest " + " ".join(cfg.tests))
        case = case._replace(message=why) if why else case
        cases.append(case)
    counts = {s: sum(c.status == s for c in cases) for s in (PASSED, FAILED, ERROR, SKIPPED)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    return StepResult("tests", _status(cases), proc.seconds, cases, summary)


_RAW_BAD = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
MAX_JUNIT_BYTES = 256 << 20


def _pytest_cases(xml_path: Path) -> list[Case]:
    """The cases of pytest's JUnit XML. pytest writes a control character of a file name (and
    some of a test id) into an attribute as is, which no XML parser reads: each such byte is
    written as its escape (\x01) first, and a file that still cannot be parsed is one error case,
    never an internal error of the gate."""
    try:
        raw = _RAW_BAD.sub(lambda m: b"\\x%02x" % m.group()[0], read_regular(xml_path, MAX_JUNIT_BYTES))
        root = ET.fromstring(raw)
    except (OSError, ET.ParseError) as exc:
        return [
            Case(
                "pytest JUnit XML", "tests", ERROR, f"pytest's JUnit XML could not be read: {exc}", "", 0.0, None, None
            )
        ]
    cases = []
    for tc in root.iter("testcase"):
        status, message, text = PASSED, "", ""
        for tag, st in (("failure", FAILED), ("error", ERROR), ("skipped", SKIPPED)):
            el = tc.find(tag)
            if el is not None:
                status, message, text = st, el.get("message", ""), (el.text or "")
                break
        line = tc.get("line")
        cases.append(
            Case(
                tc.get("name", "?"),
                tc.get("classname", "tests"),
                status,
                message,
                text,
                float(tc.get("time", 0) or 0),
                tc.get("file"),
                int(line) + 1 if line else None,
            )
        )
    return cases


def repro_step(cfg: GateConfig, work: Path, deadline: float) -> StepResult:
    cases: list[Case] = []
    start = time.monotonic()
    end = start + deadline
    for entry in cfg.repro:
        incident, _, variant = entry.partition(":")
        cmd = python_hctool("repro", incident, "--json", "--artifacts", str((work / f"repro-{incident}").resolve()))
        if variant:
            cmd += ["--variant", variant]
        proc = run_command(
            cmd, cfg.root, max(1.0, end - time.monotonic()), work, f"repro-{incident}-{variant or 'all'}"
        )
        try:
            report = json.loads(proc.stdout) if proc.code in (0, 1) else None
        except json.JSONDecodeError:
            report = None
        if report is None:
            cases.append(_could_not_run("repro", proc, f"hctool repro {entry}"))
            continue
        for v in report["variants"]:
            first = _divergence(v.get("first_divergence"))
            msg = f"verdict {v['verdict']}, expected {' | '.join(v['expected'])}"
            sites = ""
            if first is not None:  # the cause and the culprit first, then where each rank stopped and the calls seen
                msg += f"; {first.cause_line()}"
                sites = "\n".join([first.symptom_line(), counts_line(v)])
            cases.append(
                Case(
                    f"{incident}:{v['name']}",
                    f"repro.{incident}",
                    PASSED if v["ok"] else FAILED,
                    "" if v["ok"] else msg,
                    f"{msg}\n{sites}\nartifacts: {v.get('artifacts', '')}".strip(),
                    float(v.get("seconds", 0)),
                )
            )
    ok = sum(c.status == PASSED for c in cases)
    return StepResult(
        "repro", _status(cases), time.monotonic() - start, cases, f"{ok}/{len(cases)} variant(s) as expected"
    )


def _divergence(doc):
    from hctool.consensus.model import Divergence, ReportError

    if not doc:
        return None
    try:
        return Divergence.from_json(doc)
    except ReportError:
        return None


def chaos_step(cfg: GateConfig, work: Path, deadline: float) -> StepResult:
    ch = cfg.chaos
    cmd = python_hctool(
        "chaos",
        "explore",
        *shlex.split(ch.target),
        "--budget",
        str(ch.budget),
        "--seed",
        str(ch.seed),
        "--json",
        "--artifacts",
        str((work / "chaos").resolve()),
    )
    if ch.shard:
        cmd += ["--shard", ch.shard]
    proc = run_command(cmd, cfg.root, deadline, work, "chaos")
    try:
        report = json.loads(proc.stdout) if proc.code is not None else None
    except json.JSONDecodeError:
        report = None
    if not isinstance(report, dict) or report.get("verdict") not in ("valid", "invalid"):
        case = _could_not_run("chaos", proc, f"hctool chaos explore {ch.target}")
        if isinstance(report, dict):  # it ran, but could not decide (verdict unknown)
            case = case._replace(message=f"verdict {report.get('verdict')!r}")
        return StepResult("chaos", ERROR, proc.seconds, [case], f"{case.name}: {case.message}")
    cases = chaos_cases(report, ch.target, ch.seed, proc.seconds)
    anomalies = report.get("anomalies", [])
    return StepResult(
        "chaos",
        _status(cases),
        proc.seconds,
        cases,
        f"{report['verdict']}: {report.get('schedules', 0)} schedule(s), {len(anomalies)} anomal(y/ies)",
    )


def chaos_cases(report: dict, target: str, seed: int, seconds: float) -> list[Case]:
    """One case per explored schedule (where the report lists them under "runs"),
    else one for the exploration; then one per anomaly, with its replay command."""
    status = {"valid": PASSED, "invalid": FAILED, "unknown": SKIPPED}
    runs = report.get("runs")
    if runs:
        cases = [
            Case(
                f"{r.get('name', i)}: {'; '.join(r.get('schedule') or []) or 'no faults'}",
                "chaos",
                status.get(r.get("verdict"), ERROR),
                {
                    "invalid": "violated: " + ", ".join(r.get("invariants") or []),
                    "unknown": "could not judge this schedule",
                }.get(r.get("verdict"), ""),
                f"artifacts: {r.get('artifacts', '')}",
                float(r.get("seconds") or 0),
            )
            for i, r in enumerate(runs, 1)
        ]
    else:
        cases = [
            Case(
                f"{report.get('schedules', 0)} schedule(s), seed {seed}",
                "chaos",
                PASSED if report["verdict"] == "valid" else FAILED,
                "",
                f"target: {target}",
                seconds,
            )
        ]
    from hctool.chaos.report import anomaly_lines, describe

    for i, a in enumerate(report.get("anomalies", []), 1):
        said = describe(a)  # the sentences the terminal and the page print, not the evidence as JSON
        lines = [said.cause, *([said.symptom] if said.symptom else []), *(f"  {f}" for f in said.facts)]
        lines += [f"{label}: {v if isinstance(v, str) else '; '.join(v)}" for label, v in anomaly_lines(a)]
        cases.append(Case(f"anomaly {i}: {a['invariant']}", "chaos", FAILED, said.cause, "\n".join(lines)))
    return cases
