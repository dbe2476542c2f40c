"""Each invariant, shown on a deliberately broken engine (the test-only probe
tests/chaos/probes/break_engine.py, HCTOOL_TEST_BREAK=INVARIANT): that checker reports,
and no other one does."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

BREAK_PROBE = Path(__file__).with_name("probes") / "break_engine.py"

FLAGS = ["--tp", "2", "--enable-hierarchical-cache", "--max-total-tokens", "1024"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("invariant", ["consensus", "liveness", "correctness", "accounting", "metrics"])
def test_only_the_broken_invariant_reports(invariant, hctool_cmd, clean_env, tmp_path, no_leftover_processes):
    sched = tmp_path / "healthy.toml"
    sched.write_text("heal_s = 1\n")  # no faults: the engine's own bug is the only trouble
    env = {**clean_env, "HCTOOL_PROBES": str(BREAK_PROBE), "HCTOOL_TEST_BREAK": invariant}
    out = subprocess.run(
        [*hctool_cmd, "chaos", "run", str(sched), "--json", "--artifacts", str(tmp_path / "run"), "--", *FLAGS],
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["verdict"] == "invalid"
    assert {a["invariant"] for a in report["anomalies"]} == {invariant}, json.dumps(report["anomalies"], indent=1)[
        :3000
    ]
    a = report["anomalies"][0]
    assert a["evidence"] and a["replay"].startswith("hctool chaos run ") and a["reproduced"] == "1/1"
