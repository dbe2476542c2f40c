"""The linter on our own engine: the #30760 shape (the per-poll vote inside the
admission loop) is the one finding; the bulk and per-tick paths are clean.

Keyed by code, not by file path: the engine's files move between packages."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def _text(path: str, line: int) -> str:
    return (REPO / path).read_text().splitlines()[line - 1]


def test_engine_has_exactly_the_per_poll_finding():
    out = subprocess.run([sys.executable, "-m", "hctool", "lint", "engine", "--format", "json"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    findings = json.loads(out.stdout)
    assert len(findings) == 1, [(f["rule"], f["path"], f["line"]) for f in findings]
    (f,) = findings
    assert (f["rule"], f["severity"]) == ("HC101", "high")
    assert "self.tree_cache.check_prefetch_progress(req.rid)" in _text(f["path"], f["line"])
    related = [(r, _text(r["path"], r["line"])) for r in f["related"]]
    # The loop over the waiting queue, the free-count budget that breaks it, and the chain
    # down to the MAX vote inside HiRadixCache.
    assert any("for req in self.waiting_queue" in text for _, text in related)
    assert any("available_size()" in r["message"] for r, _ in related)
    assert any("HiRadixCache." in r["message"] for r, _ in related)
    assert "issues `dist.all_reduce()`" in f["related"][-1]["message"]
