"""A trace folder that fills up never kills or changes the user's program: the recorder stops,
the program finishes with its own result and exit code, and the report says where the
comparison stopped (`incomplete`), with the verdict of what was compared.

Two ways to fill it: a tmpfs mounted for the test (a real full disk: needs root, skipped
otherwise), and RLIMIT_FSIZE on one rank only (EFBIG for that rank's files: no root needed, and
the other rank's trace stays whole, so the analysis must set its later calls aside)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hctool.protocol.records import PER_SEGMENT

PROGRAM = Path(__file__).resolve().parent / "programs" / "many_calls.py"
# The second ring segment of each rank cannot be reserved, and 2 x CALLS records (3.1 MB) do not
# fit the 2.5 MiB tmpfs: without the reservation both ranks die of SIGBUS (measured: -7 each).
CALLS = PER_SEGMENT + 8000


def expected_line(rank: int, n: int = CALLS) -> str:
    return f"rank {rank}: {n} calls, total {sum(2 * (i % 7) for i in range(n))}"


def run(trace: Path, env_extra: dict, calls: int = CALLS) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", CALLS=str(calls), **env_extra)
    env.pop("HCTOOL_DEBUG", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hctool",
            "check-consensus",
            "run",
            "--nproc",
            "2",
            "--timeout",
            "200",
            "--json",
            "--trace-dir",
            str(trace),
            "--",
            str(PROGRAM),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
    )
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"exit {proc.returncode}, no JSON report; stderr:\n{proc.stderr[-3000:]}") from None
    return proc, report


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2.5 MiB tmpfs: room for one 1 MiB ring segment per rank and the logs, not for a second."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2560k", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); the RLIMIT_FSIZE test covers it")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow  # ~25 s here; the RLIMIT_FSIZE case below takes the same path and runs by default
def test_a_full_trace_disk_stops_recording_and_the_program_finishes(small_tmpfs, no_leftover_processes):
    trace = small_tmpfs / "trace"
    proc, report = run(trace, {})
    logs = {r: (trace / f"rank{r}.log").read_text() for r in (0, 1)}
    for r in (0, 1):  # the program's own result, as without hctool (before: both ranks died of SIGBUS)
        assert expected_line(r) in logs[r], logs[r]
        assert logs[r].count("hctool: the trace folder cannot take more") == 1, logs[r]
    assert report["exit_codes"] == {"0": 0, "1": 0}
    assert report["verdict"] == "consistent", report
    assert proc.returncode == 0, proc.stderr
    assert [(e["rank"], e["reason"], e["seq"]) for e in report["incomplete"]] == [
        (0, "trace disk full", PER_SEGMENT),
        (1, "trace disk full", PER_SEGMENT),
    ]
    assert f"hctool: incomplete: trace disk full at seq {PER_SEGMENT} of group 0:[0,1] on rank 1" in proc.stderr


def test_one_rank_trace_cut_short_is_compared_as_far_as_it_goes(tmp_path, no_leftover_processes):
    trace, calls = tmp_path / "trace", PER_SEGMENT + 500
    proc, report = run(trace, {"LIMIT_RANK": "1", "LIMIT_BYTES": str(PER_SEGMENT * 64 + 4096)}, calls)
    log1 = (trace / "rank1.log").read_text()
    assert expected_line(1, calls) in log1 and expected_line(0, calls) in (trace / "rank0.log").read_text()
    # rank 0 recorded every call, rank 1 the first segment's: the rest is unknown, not missing, and a
    # run not seen whole is not called consistent (exit 1: incomplete, with where the comparison stopped)
    assert report["verdict"] == "incomplete", report.get("first_divergence")
    assert "trace file too large at seq" in report["reason"] and proc.returncode == 1, proc.stderr
    assert log1.count("hctool: the trace folder cannot take more (File too large)") == 1, log1
    assert report["incomplete"] == [
        {"rank": 1, "reason": "trace file too large", "errno": "EFBIG", "group": "0:[0,1]", "seq": PER_SEGMENT}
    ]
    assert report["counts"]["0"]["all_reduce"] == calls and report["exit_codes"] == {"0": 0, "1": 0}
    # `analyze` later reads the mark and says the same
    again = subprocess.run(
        [sys.executable, "-m", "hctool", "check-consensus", "analyze", "--json", str(trace)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(again.stdout)["incomplete"] == report["incomplete"], again.stderr
