"""One small program per pattern (tests/lint/fixtures/corpus): the false-positive shapes of
issue #11 stay clean, the real divergences are each reported, at the marked lines."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hctool.lint.config import LintConfig
from hctool.lint.runner import lint

from .conftest import EXPECT_RE

CORPUS = Path(__file__).parent / "fixtures" / "corpus"
PROGRAMS = sorted(p.name for p in CORPUS.glob("*.py"))


def _lint_alone(name: str, tmp_path: Path):
    shutil.copy(CORPUS / name, tmp_path / name)
    return lint([tmp_path], LintConfig(root=tmp_path), jobs=1, cwd=tmp_path)


def _expected(name: str) -> set:
    out = set()
    for lineno, line in enumerate((CORPUS / name).read_text().splitlines(), 1):
        m = EXPECT_RE.search(line)
        if m:
            out |= {(code, lineno) for code in m.group(1).replace(",", " ").split()}
    return out


def test_corpus_has_both_kinds():
    assert any(p.startswith("fp_") for p in PROGRAMS) and any(p.startswith("tp_") for p in PROGRAMS)


@pytest.mark.parametrize("name", PROGRAMS)
def test_corpus_program(name, tmp_path):
    report = _lint_alone(name, tmp_path)
    assert not report.errors
    found = {(f.rule, f.line) for f in report.findings}
    want = _expected(name)
    if name.startswith("fp_"):
        assert not want and found == set(), [(f.rule, f.line, f.message) for f in report.findings]
    else:
        assert want and found == want, [(f.rule, f.line, f.message) for f in report.findings]


def test_severity_follows_the_source(tmp_path):
    report = _lint_alone("tp_budgets_clock_role.py", tmp_path)
    by_rule = {f.rule: f.severity for f in report.findings}
    assert by_rule == {"HC103": "high", "HC101": "high", "HC102": "low"}  # pool, clock, rank-id role


def test_one_finding_per_condition_with_the_others_related(tmp_path):
    # The early return on the poll's result skips init_load_back() once per request in the loop
    # below it: one finding, not one per collective call.
    report = _lint_alone("tp_event_gated_load_back.py", tmp_path)
    (f,) = [f for f in report.findings if f.rule == "HC103" and "init_load_back" in f.message]
    assert any("rank-local condition" in m for _, _, m in f.related)
