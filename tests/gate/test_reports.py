"""The gate's outputs in-process: JUnit XML against the common schema (with hostile
text), SARIF when no lint ran, GitHub workflow-command escaping; and the
validators themselves, which must reject what the CI parsers reject."""

from __future__ import annotations

import json

from hctool.gate.report import github_annotations, markdown_summary, write_junit, write_sarif
from hctool.gate.steps import Case, StepResult
from tests.gate.schemas import junit_errors, sarif_errors

HOSTILE = 'rank 0: all_reduce @ x.py:3 <&> "quoted" ]]> \x00\x1b[31m tail – ünïcode\nsecond line, with: colons %'


def _steps() -> list[StepResult]:
    lint = StepResult(
        "lint",
        "failed",
        1.5,
        [Case("HC102 a/b.py:7", "lint.HC102", "failed", HOSTILE, HOSTILE, file="a/b.py", line=7)],
        "1 finding(s)",
    )
    tests = StepResult(
        "tests",
        "error",
        9.0,
        [
            Case("test_ok[1-2]", "tests.test_x", "passed", seconds=0.5, file="tests/test_x.py", line=4),
            Case("test_skip", "tests.test_x", "skipped", "no GPU"),
            Case("test_bad", "tests.test_x", "failed", "boom", "trace\n" + HOSTILE),
            Case("pytest tests", "tests", "error", "deadline passed", ""),
        ],
        "1 passed, 1 failed",
    )
    return [lint, tests]


def test_junit_is_valid_and_counts_match(tmp_path):
    path = tmp_path / "out" / "junit.xml"
    write_junit(_steps(), path)
    text = path.read_text()
    assert junit_errors(text) == []
    assert 'tests="5" failures="2" errors="1" skipped="1"' in text
    assert "\x00" not in text and "\x1b" not in text and "all_reduce @ x.py:3 &lt;&amp;&gt;" in text


def test_validators_reject_broken_documents(tmp_path):
    path = tmp_path / "j.xml"
    write_junit(_steps(), path)
    good = path.read_text()
    assert any(
        "failures=2 but the suite holds 1" in e for e in junit_errors(good.replace('failures="1"', 'failures="2"', 1))
    )
    assert any(
        "missing required attribute 'name'" in e
        for e in junit_errors(good.replace('<testcase name="test_skip"', "<testcase"))
    )
    assert any("<bogus> not allowed" in e for e in junit_errors(good.replace("<system-err />", "<bogus />", 1)))
    assert any("not a number" in e for e in junit_errors(good.replace('time="9.000"', 'time="9s"')))
    assert junit_errors("<testsuites><testsuite") != []
    assert sarif_errors({"version": "2.0.0", "runs": []}) == ["version is '2.0.0', must be '2.1.0'"]
    bad = {
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "x"}},
                "results": [
                    {"level": "fatal", "message": {}, "locations": [{"physicalLocation": {"region": {"startLine": 0}}}]}
                ],
            }
        ],
    }
    errors = sarif_errors(bad)
    assert len(errors) == 4 and any("level 'fatal'" in e for e in errors)


def test_sarif_without_a_lint_step_is_a_valid_empty_run(tmp_path):
    write_sarif(_steps()[1:], tmp_path / "s.sarif")
    doc = json.loads((tmp_path / "s.sarif").read_text())
    assert sarif_errors(doc) == [] and doc["runs"][0]["results"] == []


def test_github_annotations_escape_properties_and_message():
    lines = github_annotations(_steps())
    assert len(lines) == 3  # the failed finding, the failed test, the broken step; not the pass or the skip
    first = lines[0]
    assert first.startswith("::error file=a/b.py,line=7,title=hctool gate lint%3A HC102 a/b.py%3A7::")
    body = first.split("::", 2)[2]
    assert "\n" not in body and "%0Asecond line, with: colons %25" in body


def test_chaos_report_becomes_one_case_per_schedule_and_anomaly(tmp_path):
    from hctool.gate.steps import chaos_cases

    # the shape of `hctool chaos explore --json` (docs/contracts.md)
    report = {
        "verdict": "invalid",
        "target": "--scenario 30760",
        "seed": 3,
        "schedules": 3,
        "history": "h.jsonl",
        "anomalies": [
            {
                "invariant": "consensus",
                "evidence": {
                    "verdict": "diverged",
                    "cause": "cause: rank 1, extra all_reduce at train.py:13 (log_metric)",
                    "symptom": "symptom: rank 0 blocked in barrier at train.py:20 (main)",
                },
                "schedule": [{"kind": "free-delay", "ms": 30.0, "target": "rank:1"}],
                "shrunk": None,
                "replay": "hctool chaos run a.toml --scenario 30760",
                "reproduced": "4/5",
            }
        ],
        "runs": [
            {
                "name": "s1",
                "schedule": ["free-delay:rank=1,ms=30"],
                "verdict": "valid",
                "invariants": [],
                "seconds": 20.5,
                "artifacts": "r1",
            },
            {
                "name": "s2",
                "schedule": ["clock-skew:rank=0,ms=5"],
                "verdict": "invalid",
                "invariants": ["consensus"],
                "seconds": 31.0,
                "artifacts": "r2",
            },
            {"name": "s3", "schedule": [], "verdict": "unknown", "invariants": [], "seconds": 9.0},
        ],
    }
    cases = chaos_cases(report, "--scenario 30760", 3, 70.0)
    assert [(c.name, c.status) for c in cases] == [
        ("s1: free-delay:rank=1,ms=30", "passed"),
        ("s2: clock-skew:rank=0,ms=5", "failed"),
        ("s3: no faults", "skipped"),
        ("anomaly 1: consensus", "failed"),
    ]
    # the JUnit message is the cause line (a CI page shows it first); the text the sentences, no JSON
    assert cases[-1].message == "cause: rank 1, extra all_reduce at train.py:13 (log_metric)"
    assert "symptom: rank 0 blocked in barrier" in cases[-1].text and "free-delay:rank=1,ms=30" in cases[-1].text
    assert "hctool chaos run a.toml" in cases[-1].text and "4 of 5 runs" in cases[-1].text and "{" not in cases[-1].text
    write_junit([StepResult("chaos", "failed", 70.0, cases, "invalid")], tmp_path / "j.xml")
    assert junit_errors((tmp_path / "j.xml").read_text()) == []
    # a report without per-schedule runs (the bare contract) still gives one case
    bare = dict(report, runs=None, anomalies=[], verdict="valid")
    assert [c.status for c in chaos_cases(bare, "t", 3, 1.0)] == ["passed"]


def test_a_multirank_failure_reads_cause_first_and_once():
    """The plugin's failure text starts with its message (the cause line): the annotation says it
    once, the step summary lists it under the table."""
    cause = "ranks diverged: cause: rank 0, extra all_reduce at layers.py:38 (forward)"
    text = (
        f"{cause}\nsymptom: rank 0 blocked in all_reduce at layers.py:35 (forward)\n  rank 0: all_reduce @ layers.py:38"
    )
    step = StepResult("tests", "failed", 3.0, [Case("test_tp", "tests.test_tp", "failed", cause, text)], "1 failed")
    [annotation] = github_annotations([step])
    assert annotation.count("extra all_reduce at layers.py") == 1 and "symptom" in annotation
    summary = markdown_summary([step], 1)
    assert summary.splitlines()[-1] == f"- ❌ tests: `test_tp`: {cause}"
