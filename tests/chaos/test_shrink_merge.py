"""Shrinking (on a predicate standing for "the run still fails"), CI shards, and
`chaos merge` / usage errors through the real CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import time

import pytest

from hctool.chaos.explore import replay_trail, reproduces, shard_indices, shrink
from hctool.chaos.invariants import Anomaly
from hctool.chaos.report import merge
from hctool.chaos.runner import RunResult
from hctool.chaos.schedule import Schedule
from hctool.protocol.faults import parse_fault


def test_shrink_keeps_only_the_culprits_at_their_smallest():
    faults = [
        parse_fault(s)
        for s in (
            "storage-error:p=0.4",
            "free-delay:rank=1,ms=400,p=0.7,start_s=3",
            "request-burst:n=5,start_s=1",
            "d2h-sleep:ms=80",
        )
    ]

    # "fails" iff rank 1's free delay is at least 90 ms and a burst of any size is there
    def still(s: Schedule, name: str) -> bool:
        fd = [f for f in s.faults if f.kind == "free-delay" and f.rank == 1 and f.ms >= 90]
        return bool(fd) and any(f.kind == "request-burst" for f in s.faults)

    shrunk, attempts, trail = shrink(None, Schedule(tuple(faults)), "consensus", budget_s=60, predicate=still)
    assert [f.kind for f in shrunk.faults] == ["free-delay", "request-burst"]
    fd, burst = shrunk.faults
    assert (fd.p, fd.start_s, burst.n, burst.start_s) == (1.0, 0.0, 1, 0.0)
    assert 90 <= fd.ms < 180 and attempts < 40
    assert trail[0].faults == tuple(faults) and trail[-1] == shrunk and len(trail) > 2


class _Scripted:
    """Stands in for ChaosRunner.run in the acceptance arithmetic only: run k of a
    schedule fails iff script[k] (what a real runner reports is tested elsewhere)."""

    def __init__(self, script: str, seconds: float = 0.0):
        self.script, self.calls, self.seconds = script, 0, seconds  # seconds: how long a run takes

    def run(self, sched, name):
        time.sleep(self.seconds)
        hit = self.script[self.calls] == "x"
        self.calls += 1
        return RunResult(name, "invalid" if hit else "valid", [Anomaly("consensus", {})] if hit else [], [], 0.0, "")


def test_a_reduction_is_kept_only_if_it_reproduces_k_of_n_with_early_exit():
    sched = Schedule(())
    cases = [
        ("xxx", 3, 3, True, 3),
        ("x.xx", 3, 3, False, 2),  # the first miss of 3/3 decides
        (".xxx", 3, 4, True, 4),
        ("..xx", 3, 4, False, 2),
        ("xx.x", 2, 4, True, 2),
    ]
    for script, need, tries, ok, runs in cases:
        r = _Scripted(script)
        v = reproduces(r, sched, "consensus", need, tries, "t")
        assert (v.reproduced, v.runs, r.calls) == (ok, runs, runs), script
    # a trigger that fires 1 run in 2 survives 3/3 with p = 1/8 (the old "any of 2 runs": 3/4)
    orders = ["".join(o) for o in itertools.product("x.", repeat=3)]
    kept = sum(reproduces(_Scripted(o), sched, "consensus", 3, 3, "t").reproduced for o in orders)
    assert kept == 1


def test_a_shrunk_schedule_below_the_rate_backs_off_along_its_trail():
    a, b, c = (Schedule((parse_fault(f"free-delay:rank=1,ms={ms}"),)) for ms in (80, 40, 20))
    # c (the last reduction) reproduces 1 of 3, b 3 of 3: b is what gets reported
    out = replay_trail(_Scripted("x..xxx"), [a, b, c], "consensus", 3, 3)
    assert [(r.schedule, r.hits, r.runs) for r in out] == [(c, 1, 3), (b, 3, 3)]
    assert replay_trail(_Scripted("xxx"), [a, b, c], "consensus", 3, 3) == [(c, 3, 3)]


def test_nothing_starts_past_the_budget():
    """explore's --budget covers shrinking and replaying: past its deadline no run starts, and a
    replay cut short says how many ran."""
    sched = Schedule((parse_fault("free-delay:rank=1,ms=80"),))
    assert replay_trail(_Scripted("xxx"), [sched], "consensus", 3, 3, deadline=time.monotonic() - 1) == []
    r = _Scripted("xxxxxxxxxx", seconds=0.2)
    out = replay_trail(r, [sched], "consensus", 10, 8, deadline=time.monotonic() + 0.5)
    assert out[0].runs == r.calls < 10 and out[0].hits == out[0].runs
    assert reproduces(_Scripted("xxx"), sched, "consensus", 3, 3, "t", deadline=time.monotonic() - 1).runs == 0


def test_shards_cover_every_schedule_once():
    n = 3
    taken = [list(itertools.islice(shard_indices((i, n)), 10)) for i in range(1, n + 1)]
    flat = sorted(x for t in taken for x in t)
    assert flat == list(range(30))


def _report(verdict, schedules, anomalies=(), shard="1/2"):
    return {
        "verdict": verdict,
        "target": "--scenario 30760 --variant bulk",
        "seed": 1,
        "schedules": schedules,
        "anomalies": list(anomalies),
        "history": f"h{shard}.jsonl",
        "shard": shard,
        "runs": [],
    }


def test_merge_joins_shards(hctool_cmd, clean_env, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report("valid", 4)))
    b.write_text(json.dumps(_report("valid", 5, shard="2/2")))
    out = subprocess.run(
        [*hctool_cmd, "chaos", "merge", str(a), str(b), "--json"],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    merged = json.loads(out.stdout)
    assert (merged["verdict"], merged["schedules"], merged["shards"]) == ("valid", 9, ["1/2", "2/2"])
    bad = merge([_report("valid", 4), _report("invalid", 2, [{"invariant": "liveness", "evidence": {}}], "2/2")])
    assert bad["verdict"] == "invalid" and bad["anomalies"][0]["invariant"] == "liveness"
    assert merge([_report("valid", 4), _report("unknown", 1)])["verdict"] == "unknown"


@pytest.mark.parametrize(
    "second, says",
    [
        (lambda r: r, "shard 1/2 is given twice"),
        (lambda r: dict(r, target="-- torchrun --nproc-per-node 2 train.py", shard="2/2"), "different targets"),
        (lambda r: dict(r, seed=2, shard="2/2"), "different seeds"),
    ],
)
def test_merge_refuses_what_is_not_shards_of_one_exploration(hctool_cmd, clean_env, tmp_path, second, says):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report("valid", 4)))
    b.write_text(json.dumps(second(_report("valid", 5))))
    out = subprocess.run(
        [*hctool_cmd, "chaos", "merge", str(a), str(b), "--json"],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == "", out.stdout
    assert out.stderr.startswith("Error: ") and says in out.stderr.splitlines()[0]


def test_usage_errors_are_one_line(hctool_cmd, clean_env, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[faults]]\nkind = "warp-drive"\n')
    cases = [
        (["chaos", "run", str(bad), "--scenario", "30760"], "Error: "),
        (["chaos", "explore", "--scenario", "30760", "--shard", "3/2"], "Error: bad --shard"),
        (["chaos", "explore", "--", "--tp", "3"], "Error: engine flags"),
        (["chaos", "explore", "--scenario", "30760", "--accept", "4/3"], "Error: bad --accept"),
    ]
    for args, start in cases:
        out = subprocess.run([*hctool_cmd, *args], capture_output=True, text=True, env=clean_env, timeout=60)
        assert out.returncode == 2 and out.stderr.startswith(start), (args, out.stderr)
        assert "Traceback" not in out.stderr
