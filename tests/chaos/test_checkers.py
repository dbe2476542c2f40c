"""The checkers' rules on recorded evidence (the files a run leaves behind); the
broken-engine tests (test_broken_engine.py, slow) show each on real ranks."""

from __future__ import annotations

import json

from hctool.chaos.invariants import RunRecord, check_all
from hctool.consensus.model import Report, Verdict

METRICS = (
    'hicache_cached_tokens_total{cache_source="device"} 32.0\n'
    'hicache_cached_tokens_total{cache_source="host"} 0.0\n'
    'hicache_cached_tokens_total{cache_source="storage"} 16.0\n'
)
QUIESCE = {
    "rank": 0,
    "tick": 9,
    "l1": {"total": 64, "free": 60, "cached": 4, "in_use": 0},
    "locked_nodes": [],
    "req_slots": {"total": 8, "free": 8},
    "host_ref_nodes": [],
    "in_flight": 0,
    "l2": {"total": 128, "free": 120, "used": 8},
}


def _record(tmp_path, **kw) -> RunRecord:
    (tmp_path / "chaos").mkdir(exist_ok=True)
    base = dict(
        run_dir=tmp_path,
        outcome="done",
        death=None,
        watcher_report=None,
        final_report=Report(Verdict.CONSISTENT, 2),
        sent=2,
        answered={("workload", "0.0"): [5, 6, 7], ("workload", "0.1"): [8, 9]},
        meta={
            ("workload", "0.0"): {
                "cached_tokens": 48,
                "cached_tokens_details": {"device": 32, "host": 0, "storage": 16},
            },
            ("workload", "0.1"): {"cached_tokens": 0, "cached_tokens_details": {"device": 0, "host": 0, "storage": 0}},
        },
        expected={("workload", "0.0"): [5, 6, 7], ("workload", "0.1"): [8, 9]},
        errors=[],
        unanswered=0,
        metrics_text=METRICS,
    )
    base.update(kw)
    return RunRecord(**base)


def _quiesce(tmp_path, **changes):
    (tmp_path / "chaos").mkdir(exist_ok=True)
    (tmp_path / "chaos" / "quiesce-rank0.json").write_text(json.dumps({**QUIESCE, **changes}))


def _invariants(record):
    anomalies, blind = check_all(record)
    return sorted({a.invariant for a in anomalies}), blind


def test_a_clean_run_passes_every_checker(tmp_path):
    rec = _record(tmp_path)
    _quiesce(tmp_path)
    assert _invariants(rec) == ([], [])


def test_each_rule_reports_under_its_own_name(tmp_path):
    _quiesce(tmp_path)
    assert _invariants(_record(tmp_path, answered={("workload", "0.0"): [5, 6, 1], ("workload", "0.1"): [8, 9]}))[
        0
    ] == ["correctness"]
    assert _invariants(_record(tmp_path, metrics_text=METRICS.replace("32.0", "33.0")))[0] == ["metrics"]
    assert _invariants(_record(tmp_path, final_report=Report(Verdict.DIVERGED, 2)))[0] == ["consensus"]
    _quiesce(tmp_path, locked_nodes=[3])
    assert _invariants(_record(tmp_path))[0] == ["accounting"]
    _quiesce(tmp_path, l1={"total": 64, "free": 59, "cached": 4, "in_use": 0})
    assert _invariants(_record(tmp_path))[0] == ["accounting"]
    _quiesce(tmp_path)
    (tmp_path / "chaos" / "starved-rank1.json").write_text(json.dumps({"rank": 1, "ticks": 1000, "state": {}}))
    assert _invariants(_record(tmp_path))[0] == ["liveness"]


def test_a_stalled_run_blinds_the_quiesce_checkers(tmp_path):
    (tmp_path / "rank0.log").write_text("[rank 0] tick 7: waiting 3 running 0 prefetching 0 L1 free 48 ...\n")
    found, blind = _invariants(_record(tmp_path, outcome="stalled", unanswered=3))
    assert found == ["liveness"] and blind == ["accounting", "metrics"]
    anomalies, _ = check_all(_record(tmp_path, outcome="stalled", unanswered=3))
    assert "waiting 3 running 0" in anomalies[0].evidence["status"]["rank0"]
