"""Flight Recorder dumps as an NCCL job of many ranks leaves them (benchmarks/bench_scale.py: every
key of a real entry, TP groups, batched p2p, coalesced all_gathers, rings that start at different
points), one fault at one rank: `check-consensus analyze` names that rank and line, names a rank
that left no dump as such, and folds the ranks that stopped alike (docs/performance.md "check-
consensus at scale" runs the same at 1,024 ranks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_scale  # noqa: E402

WORLD, ODD = 16, 8


def _analyze(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hctool", "check-consensus", "analyze", str(folder), *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.parametrize(
    "fault, kind, line",
    [("extra", "extra", 77), ("missing", "missing", 40), ("shape", "shape", 40), ("nodump", "missing", 40)],
)
def test_the_faulty_rank_and_its_line(tmp_path, fault, kind, line):
    bench_scale.make(tmp_path / "dumps", WORLD, 2000, fault, ODD)
    proc = _analyze(tmp_path / "dumps", "--json")
    report = json.loads(proc.stdout)
    first = report["first_divergence"]
    assert first is not None, (report["verdict"], report.get("reason"), proc.stderr[-2000:])
    assert (first["kind"], first["culprit_ranks"], first["cause"]["site"]) == (kind, [ODD], f"train.py:{line}"), first
    assert proc.returncode == 1


def test_a_rank_without_a_dump_is_named_and_the_rest_fold(tmp_path):
    bench_scale.make(tmp_path / "dumps", WORLD, 2000, "nodump", ODD)
    proc = _analyze(tmp_path / "dumps")
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"HUNG  cause: rank {ODD} never reached the all_reduce at train.py:40"), lines[:3]
    # one clause for the fifteen ranks that wait alike, not fifteen
    assert lines[1] == f"symptom: ranks 0-7,9-15 blocked in all_reduce at train.py:40 (step); rank {ODD} never seen", (
        lines[1]
    )
    assert f"rank(s) {ODD} of {WORLD} left no Flight Recorder dump" in lines[2], lines[2]
