"""Helpers: write snippets to tmp_path and lint them.

`# expect: HC101` marks the line a finding is reported at (its rank-local source); `# gated` marks a
collective call that some finding lists among its related collectives.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from hctool.lint.config import LintConfig
from hctool.lint.runner import lint

EXPECT_RE = re.compile(r"# expect: ((?:HC\d{3}[ ,]*)+)")
GATED_RE = re.compile(r"#.*\bgated\b")


def expected(files: dict[str, str]) -> set[tuple[str, str, int]]:
    out = set()
    for name, text in files.items():
        for lineno, line in enumerate(textwrap.dedent(text).splitlines(), 1):
            m = EXPECT_RE.search(line)
            if m:
                out |= {(name, code, lineno) for code in re.findall(r"HC\d{3}", m.group(1))}
    return out


def expected_gated(files: dict[str, str]) -> set[tuple[str, int]]:
    return {
        (name, lineno)
        for name, text in files.items()
        for lineno, line in enumerate(textwrap.dedent(text).splitlines(), 1)
        if GATED_RE.search(line)
    }


def gated(report) -> set[tuple[str, int]]:
    """(path, line) of every collective call a finding of REPORT says its source gates."""
    return {(r.path, r.line) for f in report.findings for r in f.related if r.role == "collective"}


@pytest.fixture
def lint_snippets(tmp_path: Path):
    """lint_snippets({"a.py": src, ...}) -> (set of (file, rule, line), report)."""

    def run(files: dict[str, str], cfg: LintConfig | None = None):
        for name, text in files.items():
            p = tmp_path / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(textwrap.dedent(text))
        report = lint([tmp_path], cfg or LintConfig(root=tmp_path), jobs=1, cwd=tmp_path)
        return {(f.path, f.rule, f.line) for f in report.findings}, report

    return run


@pytest.fixture(autouse=True)
def _private_lint_cache(tmp_path_factory, monkeypatch):
    """The CLI caches under ~/.cache/hctool by default: tests use a directory of their own."""
    monkeypatch.setenv("HCTOOL_CACHE_DIR", str(tmp_path_factory.mktemp("lint-cache")))
