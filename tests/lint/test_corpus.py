"""One small program per pattern (tests/lint/fixtures/corpus): the false-positive shapes of
issue #11 stay clean, the real divergences are each reported, at the marked lines."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hctool.lint.config import LintConfig
from hctool.lint.runner import lint

from .conftest import expected, expected_gated, gated

CORPUS = Path(__file__).parent / "fixtures" / "corpus"
PROGRAMS = sorted(p.name for p in CORPUS.glob("*.py"))


def _lint_alone(name: str, tmp_path: Path):
    shutil.copy(CORPUS / name, tmp_path / name)
    return lint([tmp_path], LintConfig(root=tmp_path), jobs=1, cwd=tmp_path)


def _marks(name: str) -> tuple[set, set]:
    text = (CORPUS / name).read_text()
    return (
        {(code, lineno) for (_, code, lineno) in expected({name: text})},
        {lineno for (_, lineno) in expected_gated({name: text})},
    )


def test_corpus_has_both_kinds():
    assert any(p.startswith("fp_") for p in PROGRAMS) and any(p.startswith("tp_") for p in PROGRAMS)


@pytest.mark.parametrize("name", PROGRAMS)
def test_corpus_program(name, tmp_path):
    report = _lint_alone(name, tmp_path)
    assert not report.errors
    found = {(f.rule, f.line) for f in report.findings}
    want, want_gated = _marks(name)
    if name.startswith("fp_"):
        assert not want and found == set(), [(f.rule, f.line, f.message) for f in report.findings]
    else:
        assert want and found == want, [(f.rule, f.line, f.message) for f in report.findings]
        assert {ln for _, ln in gated(report)} == want_gated


def test_severity_follows_the_source(tmp_path):
    report = _lint_alone("tp_budgets_clock_role.py", tmp_path)
    by_rule = {f.rule: (f.severity, bool(f.premise)) for f in report.findings}
    # a pool's free count (a premise), a per-rank deadline, a rank id compared (high: it differs on
    # every rank by definition, issue 34)
    assert by_rule == {"HC103": ("medium", True), "HC101": ("high", False), "HC102": ("high", False)}


def test_one_finding_per_source_with_the_gated_collectives_related(tmp_path):
    # The event poll gates loading_check() in its own function, both calls of the poll (which enter
    # the collective on some ranks only), and init_load_back() after the return on the second call.
    report = _lint_alone("tp_event_gated_load_back.py", tmp_path)
    (f,) = report.findings
    assert f.count == 4 and f.rule == "HC103" and f.severity == "high" and f.premise is None
    roles = [r.role for r in f.related]
    assert roles.count("collective") == 4 and "exit" in roles and roles[-1] == "chain"
