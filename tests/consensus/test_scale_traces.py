"""hctool's own traces as benchmarks/bench_analyze.py writes them (the recorder's ring format, a
training step of two same-shape gradient all_reduces): one rank inserts one extra same-shape
all_reduce from another line far (more than the window's 256 calls) before the evidence, so it
pairs silently and every later call pairs across sites. The cause is that extra call, on two
ranks and with a majority alike, through the column fast path and the per-event path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_analyze  # noqa: E402


@pytest.mark.parametrize("ranks", [2, 8])
@pytest.mark.parametrize("columns", ["1", "0"])
def test_a_silent_extra_call_long_before_the_evidence(tmp_path, ranks, columns):
    bench_analyze.make(tmp_path / "trace", ranks, 4000, 1000)
    proc = subprocess.run(
        [sys.executable, "-m", "hctool", "check-consensus", "analyze", str(tmp_path / "trace"), "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, HCTOOL_ANALYZE_COLUMNS=columns),
    )
    first = json.loads(proc.stdout)["first_divergence"]
    assert first is not None, proc.stderr[-2000:]
    assert (first["kind"], first["culprit_ranks"], first["cause"]["site"]) == ("extra", [1], "train.py:77"), first
