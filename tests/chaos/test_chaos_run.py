"""`hctool chaos run` end to end as a user runs it: real ranks, real HTTP, real
in-rank faults and a controller burst, every checker looking."""

from __future__ import annotations

import json
import subprocess

import pytest

SCHEDULE = """seed = 5
[[faults]]
kind = "free-delay"
target = "one"
ms = 50
[[faults]]
kind = "d2h-sleep"
target = "rank:1"
ms = 20
p = 0.5
[[faults]]
kind = "request-burst"
n = 3
start_s = 0.0
"""
FLAGS = ["--tp", "2", "--enable-hierarchical-cache", "--max-total-tokens", "1024"]


@pytest.mark.timeout(240)
def test_a_healthy_engine_under_faults_is_valid(hctool_cmd, clean_env, tmp_path, no_leftover_processes):
    sched = tmp_path / "s.toml"
    sched.write_text(SCHEDULE)
    env = {**clean_env, "HCTOOL_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run(
        [*hctool_cmd, "chaos", "run", str(sched), "--json", "--artifacts", str(tmp_path / "run"), "--", *FLAGS],
        capture_output=True,
        text=True,
        env=env,
        timeout=220,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["verdict"] == "valid" and report["anomalies"] == [] and report["schedules"] == 1
    assert report["target"] == "-- --tp 2 " + " ".join(FLAGS[2:])
    run = report["runs"][0]
    assert run["blind"] == [], run  # every checker looked: quiesce records and /metrics were read
    events = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    # before the run: only what preparing says (a cached reference, the horizon it measured)
    assert set(kinds[: kinds.index("invoke")]) <= {"prepare-cached", "horizon"}, kinds
    assert kinds[-1] == "verdict" and "heal" in kinds
    horizon = [e for e in events if e["event"] == "horizon"]
    assert not horizon or 2.0 <= horizon[0]["seconds"] < 20.0, horizon  # the workload's length, not 20 s
    on = [e["fault"] for e in events if e["event"] == "fault-on"]
    assert any(f.startswith("request-burst") for f in on) and any(f.startswith("free-delay:rank=") for f in on)
    logs = "".join(p.read_text() for p in (tmp_path / "run" / "run1").glob("rank*.log"))
    assert "hctool: rank 1: faults" in logs  # the in-rank hooks were installed where targeted

    # A second invocation reads the reference from the cache instead of running it, and
    # the correctness checker still compares every answer with it (a mangled cache fails).
    again = subprocess.run(
        [*hctool_cmd, "chaos", "run", str(sched), "--json", "--artifacts", str(tmp_path / "again"), "--", *FLAGS],
        capture_output=True,
        text=True,
        env=env,
        timeout=220,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["runs"][0]["blind"] == []
    events = [json.loads(line) for line in (tmp_path / "again" / "history.jsonl").read_text().splitlines()]
    # the cache also keeps the reference's length: the horizon comes back without a run
    assert [e["event"] for e in events][:3] == ["prepare-cached", "horizon", "invoke"]
    assert not (tmp_path / "again" / "reference").exists()
