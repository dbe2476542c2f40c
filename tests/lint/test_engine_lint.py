"""The linter on our own engine: the #30760 shape (the per-poll vote inside the
admission loop) is the one finding; the bulk and per-tick paths are clean."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def _line_of(path, text: str) -> int:
    lines = (REPO / path).read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, f"{text!r} found {len(hits)} times in {path}"
    return hits[0]


def test_engine_has_exactly_the_per_poll_finding():
    out = subprocess.run([sys.executable, "-m", "hctool", "lint", "engine", "--format", "json"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    findings = json.loads(out.stdout)
    vote = _line_of("engine/managers/scheduler_prefill.py", "ready = self.tree_cache.check_prefetch_progress(req.rid)")
    loop = _line_of("engine/managers/scheduler_prefill.py", "for req in self.waiting_queue:")
    assert [(f["rule"], f["path"], f["line"]) for f in findings] == [("HC101", "engine/managers/scheduler_prefill.py", vote)]
    related = {(r["path"], r["line"]) for r in findings[0]["related"]}
    assert ("engine/managers/scheduler_prefill.py", loop) in related
    # The chain reaches the MAX vote inside HiRadixCache._vote_prefetch.
    assert any(r["path"] == "engine/mem_cache/hiradix_cache.py" for r in findings[0]["related"])
