"""The linter on our own engine finds exactly the buggy variants we keep on purpose:
the #30760 shape (the per-poll vote inside the admission loop) and the #29483 shape
(`--decode-restore-gate event`: loading_check() behind a rank-local event query, and
the Phase A / Phase B calls that reach it), and the #26921 shape (`--hicache-ack-check
skip-empty`: writing_check() returns before its MIN when this rank's ack queue is empty,
taught by the repo's `rank-local = ["ack_write_queue"]`); the bulk, per-tick, slot and
packed paths are clean.

Keyed by code, not by file path or line: the engine's files move between packages."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def _text(path: str, line: int) -> str:
    return (REPO / path).read_text().splitlines()[line - 1].strip()


def test_engine_has_exactly_the_kept_buggy_variants():
    out = subprocess.run(
        [sys.executable, "-m", "hctool", "lint", "engine", "--format", "json", "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    findings = json.loads(out.stdout)
    # One finding per root cause, at the rank-local source, with the collectives it gates related.
    got = sorted(
        (
            f["rule"],
            f["severity"],
            _text(f["path"], f["line"]),
            sorted(_text(r["path"], r["line"]) for r in f["related"] if r["role"] == "collective"),
        )
        for f in findings
    )
    assert got == sorted(
        [
            # 30760: this rank's KV free count (a premise the engine makes true: frees wait for copies)
            # sizes the admission budget, and the per-poll vote runs once per admitted request
            (
                "HC101",
                "medium",
                "self.token_to_kv_pool_allocator.available_size()",  # the formatter split the sum (b88adf2)
                ["ready = self.tree_cache.check_prefetch_progress(req.rid)"],
            ),
            # 29483: the event poll gates loading_check() and both calls of the poll (Phase A, Phase B)
            (
                "HC103",
                "high",
                "if events is not None and not events[-1].query():",
                sorted(
                    [
                        "self.loading_check()",
                        "if dr.restored_node is not None and tree.is_load_back_event_done(dr.consumer_index):",
                        "if not tree.is_load_back_event_done((counter.producer_index + 1) % counter.num_counters):",
                    ]
                ),
            ),
            # 26921: skip-empty's early return on this rank's ack queue, and the call that reaches it
            (
                "HC103",
                "high",
                'if self.ack_check == "skip-empty" and not self.cache_controller.ack_write_queue:',
                sorted(
                    ["return self._min(ready)", "writes, loads = self.writing_check(writes), self.loading_check(loads)"]
                ),
            ),
        ]
    ), [(f["rule"], f["path"], f["line"]) for f in findings]
    vote = next(f for f in findings if f["rule"] == "HC101")
    assert "KV free count" in vote["premise"] and vote["count"] == 1
    related = [(r, _text(r["path"], r["line"])) for r in vote["related"]]
    # The loop over the waiting queue, the budget condition that breaks it, and the chain
    # down to the MAX vote inside HiRadixCache.
    assert any("for req in self.waiting_queue" in text for r, text in related if r["role"] == "loop")
    assert any("HiRadixCache." in r["message"] for r, _ in related if r["role"] == "chain")
    assert "issues `dist.all_reduce()`" in vote["related"][-1]["message"]
