"""`hctool chaos run|explore -- CMD` on programs of our own, as a user runs it: real torchrun
ranks, the faults in them, the invariants of a command target (consensus, liveness, exits,
--same-output), usage errors before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).resolve().parent / "programs"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def chaos(tmp_path: Path, verb: str, *args: str, timeout: float = 280) -> tuple[int, dict | None, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "hctool", "chaos", verb, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stderr
    except ValueError:
        return proc.returncode, None, proc.stderr


def schedule(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sched.toml"
    path.write_text(text)
    return path


@pytest.mark.timeout(300)
def test_a_fast_clock_on_one_rank_breaks_a_wall_clock_budget(tmp_path):
    sched = schedule(tmp_path, '[[faults]]\nkind = "clock-skew"\nrank = 1\nms = 500\n')
    code, report, err = chaos(
        tmp_path,
        "run",
        str(sched),
        "--json",
        "--artifacts",
        str(tmp_path / "run"),
        "--",
        *TORCHRUN,
        str(PROGRAMS / "budget_stop.py"),
    )
    assert code == 1 and report["verdict"] == "invalid", err[-3000:]
    assert report["target"].startswith("command: ") and "budget_stop.py" in report["target"]
    (a,) = report["anomalies"]
    assert a["invariant"] == "consensus" and a["evidence"]["first_divergence"]["kind"] in ("extra", "missing")
    assert a["replay"].startswith(f"hctool chaos run {sched} -- ") and a["reproduced"] == "1/1"
    # the fault fired on rank 1 only, and the fault-free baseline ran first
    assert (tmp_path / "run" / "baseline" / "hctool-run.json").is_file()
    counts = json.loads((tmp_path / "run" / "run1" / "hctool-run.json").read_text())["faults"]
    assert counts == [{"spec": "clock-skew:rank=1,ms=500", "fired": {"1": 1}, "total": 1}]


@pytest.mark.timeout(300)
def test_same_output_sees_what_the_collectives_do_not(tmp_path):
    """Rank 0's clock decides a count that every rank follows: consistent collectives, a
    different printed result; --same-output names the lines."""
    sched = schedule(tmp_path, '[[faults]]\nkind = "clock-skew"\nrank = 0\nms = 2000\n')
    code, report, err = chaos(
        tmp_path,
        "run",
        str(sched),
        "--json",
        "--same-output",
        "^result",
        "--artifacts",
        str(tmp_path / "run"),
        "--",
        *TORCHRUN,
        str(PROGRAMS / "rank0_budget.py"),
    )
    assert code == 1 and report["verdict"] == "invalid", err[-3000:]
    assert [a["invariant"] for a in report["anomalies"]] == ["output"]
    ev = report["anomalies"][0]["evidence"]
    assert ev["missing"] and ev["missing"][0].startswith("result steps=") and ev["unexpected"] != ev["missing"]
    assert "--same-output '^result'" in report["anomalies"][0]["replay"]  # shell-quoted


@pytest.mark.parametrize(
    "args, words",
    [
        (["--kinds", "free-delay"], "acts on hctool's own engine"),
        (["--same-output", "("], "bad --same-output regex"),
        (["--", "no-such-command-here", "x"], "command not found"),
        (["--", "missing_script.py"], "script not found"),
        (["--kinds", "delay"], "needs fn=pkg.mod:Qual.name"),  # explore cannot make up a function name
        (["--nproc", "5000"], "--nproc must be between 1 and 4096"),
        (["--timeout", "0.01"], "--timeout must be between 0.1"),
    ],
)
def test_usage_errors_before_anything_runs(tmp_path, args, words):
    if "--" not in args:
        args = [*args, "--", *TORCHRUN, str(PROGRAMS / "budget_stop.py")]
    code, _, err = chaos(tmp_path, "explore", "--budget", "5", "--artifacts", str(tmp_path / "x"), *args, timeout=60)
    assert code == 2 and err.splitlines()[-2].startswith("Error: ") and words in err, err
    assert not (tmp_path / "x").exists()


def test_a_schedule_naming_a_missing_function_is_refused(tmp_path):
    sched = schedule(tmp_path, '[[faults]]\nkind = "delay"\nfn = "__main__:no_such_step"\nms = 5\n')
    code, _, err = chaos(
        tmp_path,
        "run",
        str(sched),
        "--artifacts",
        str(tmp_path / "x"),
        "--",
        *TORCHRUN,
        str(PROGRAMS / "loader_flag.py"),
        timeout=60,
    )
    assert code == 2 and "defines no 'no_such_step'" in err and not (tmp_path / "x").exists(), err


def test_the_budget_counts_the_fault_free_run(tmp_path):
    # a 1 s budget spent by a 1.5 s baseline: no schedule, and the seconds say so
    code, report, err = chaos(
        tmp_path,
        "explore",
        "--budget",
        "1",
        "--json",
        "--artifacts",
        str(tmp_path / "x"),
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(1.5)",
        timeout=120,
    )
    assert report is not None, err[-2000:]
    assert report["schedules"] == 0 and report["seconds"] >= 1.5, report


def test_shrink_with_an_unknown_invariant_writes_nothing(tmp_path):
    sched = schedule(tmp_path, "heal_s = 1\n")
    code, _, err = chaos(
        tmp_path,
        "shrink",
        str(sched),
        "--invariant",
        "bogus",
        "--artifacts",
        str(tmp_path / "x"),
        "--",
        *TORCHRUN,
        str(PROGRAMS / "loader_flag.py"),
        timeout=60,
    )
    assert code == 2 and "unknown invariant 'bogus'" in err and not (tmp_path / "x").exists(), err


@pytest.mark.timeout(200)
def test_a_python_dash_m_target_imports_from_where_hctool_ran(tmp_path):
    # each run has its own working directory; the caller's folder stays importable
    (tmp_path / "mytrain.py").write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(1)\ndist.all_reduce(t)\nprint('result', t.item())\n"
    )
    sched = schedule(tmp_path, "heal_s = 1\n")
    code, report, err = chaos(
        tmp_path,
        "run",
        str(sched),
        "--json",
        "--artifacts",
        str(tmp_path / "run"),
        "--",
        *TORCHRUN,
        "-m",
        "mytrain",
        timeout=180,
    )
    assert code == 0 and report["verdict"] == "valid", err[-3000:]


# Each finds its timing bug with generic faults only (no fn=): ~2-8 minutes each on 2 cores.
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("program", ["budget_stop.py", "loader_flag.py", "admission_pool.py", "io_deadline.py"])
def test_explore_finds_shrinks_and_replays_each_timing_bug(tmp_path, program):
    code, report, err = chaos(
        tmp_path,
        "explore",
        "--budget",
        "300",
        "--seed",
        "1",
        "--json",
        "--artifacts",
        str(tmp_path / "run"),
        "--",
        *TORCHRUN,
        str(PROGRAMS / program),
        timeout=1700,
    )
    assert code == 1 and report["verdict"] == "invalid", err[-3000:]
    a = report["anomalies"][0]
    assert a["invariant"] == "consensus" and report["first_anomaly_s"] <= 300
    shrunk = a["shrunk"] or a["schedule"]
    assert len(shrunk) <= 2 and all("fn" not in f for f in shrunk), shrunk
    hits, runs = (int(x) for x in a["reproduced"].split("/"))
    assert runs == 10 and hits >= 8, a["reproduced"]


def test_a_program_that_fails_without_faults_is_a_finding(tmp_path):
    """Not 'could not run' (exit 2): the fault-free run's divergence is the answer, exit 1, and
    nothing is explored on top of it."""
    example = Path(__file__).resolve().parents[2] / "examples" / "extra_call.py"
    code, report, err = chaos(tmp_path, "explore", "--budget", "60", "--json", "--", str(example))
    assert code == 1 and report is not None, err[-2000:]
    assert report["verdict"] == "invalid" and report["without_faults"] is True
    assert "cause: rank 1, extra all_reduce at extra_call.py:13" in report["reason"]
    assert "schedule 0" not in err
