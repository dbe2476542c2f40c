"""One run per folder (hctool/supervise/runlock.py): a second `check-consensus run` on a --trace-dir that
another run holds is refused with one Error line naming the holder; a lock whose holder died is
taken over; trace files of anything else in the folder are never read into the report; `repro`
and `chaos` claim their --artifacts the same way. Real concurrent runs, real files."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.helpers import REPO, child_env

TICKER = str(REPO / "tests" / "consensus" / "programs" / "ticker.py")


def _run(trace: Path, seconds: float = 1.0) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hctool",
            "check-consensus",
            "run",
            "--nproc",
            "2",
            "--timeout",
            "90",
            "--hang-after",
            "20",
            "--json",
            "--trace-dir",
            str(trace),
            "--",
            TICKER,
        ],
        cwd=REPO,
        env={**child_env(), "TICKER_SECONDS": str(seconds)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_traces(trace: Path, n: int = 2, deadline_s: float = 60) -> list[Path]:
    end = time.monotonic() + deadline_s
    while len(found := sorted(trace.glob("rank*-*.jsonl"))) < n:
        assert time.monotonic() < end, f"no {n} traces in {trace} after {deadline_s} s"
        time.sleep(0.05)
    return found


def test_a_second_run_on_a_held_trace_dir_is_refused_naming_the_holder(tmp_path, no_leftover_processes):
    trace = tmp_path / "trace"
    first = _run(trace, seconds=6)
    try:
        _wait_traces(trace)  # the first run's ranks record
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "hctool",
                "check-consensus",
                "run",
                "--nproc",
                "2",
                "--timeout",
                "60",
                "--json",
                "--trace-dir",
                str(trace),
                "--",
                TICKER,
            ],
            cwd=REPO,
            env={**child_env(), "TICKER_SECONDS": "1"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        out, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert second.returncode == 2 and second.stdout == "", second.stderr
    errors = [ln for ln in second.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1, second.stderr
    assert (
        f"is in use by another run: pid {first.pid} on {socket.gethostname()} (hctool check-consensus run" in errors[0]
    )
    assert first.returncode == 0 and json.loads(out)["verdict"] == "consistent", err
    assert len(list(trace.glob("rank*-*.jsonl"))) == 2  # nothing of the second run got in


def test_a_lock_left_by_a_dead_run_is_taken_over(tmp_path, no_leftover_processes):
    trace = tmp_path / "trace"
    trace.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (trace / "hctool.lock").write_text(
        json.dumps(
            {"pid": dead.pid, "host": socket.gethostname(), "command": "hctool check-consensus run", "run": "0123"}
        )
    )
    proc = _run(trace)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"taking over {trace / 'hctool.lock'} from pid {dead.pid}" in err
    left = json.loads((trace / "hctool.lock").read_text())
    assert "pid" not in left and left["run"] != "0123"  # an orderly end leaves the run id, no holder


@pytest.mark.slow  # ~12 s; the refusal of a held folder stays in the default suite
def test_traces_of_another_run_dropped_into_the_folder_are_not_read(tmp_path, no_leftover_processes):
    """Before the lock, two runs on one folder each read both jobs' calls as one rank's."""
    other = tmp_path / "other"
    proc = _run(other)
    proc.communicate(timeout=120)
    assert proc.returncode == 0
    trace = tmp_path / "trace"
    proc = _run(trace, seconds=4)
    try:
        _wait_traces(trace)
        for f in other.glob("rank1-*"):  # the other job's rank 1, as if it wrote here
            shutil.copy(f, trace / f.name.replace("rank1-", "rank1-9"))
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    report = json.loads(out)
    assert proc.returncode == 0 and report["verdict"] == "consistent", (report.get("first_divergence"), err)
    assert "hctool: ignoring rank1-9" in err and "not by the run that claimed the folder" in err
    again = subprocess.run(
        [sys.executable, "-m", "hctool", "check-consensus", "analyze", "--json", str(trace)],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and json.loads(again.stdout)["counts"] == report["counts"], again.stderr


def test_repro_and_chaos_refuse_artifacts_another_run_holds(tmp_path):
    folder = tmp_path / "artifacts"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom hctool.supervise import runlock\n"
            f"runlock.claim({str(folder)!r}, 'repro 30760'); print('held', flush=True); time.sleep(120)",
        ],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        schedule = tmp_path / "s.toml"
        schedule.write_text('seed = 1\nfaults = ["h2d-sleep:rank=1,ms=5"]\n')
        for cmd in (
            ["repro", "run", "30760", "--artifacts", str(folder)],
            ["chaos", "run", str(schedule), "--scenario", "30760", "--artifacts", str(folder)],
        ):
            done = subprocess.run(
                [sys.executable, "-m", "hctool", *cmd],
                cwd=REPO,
                env=child_env(),
                capture_output=True,
                text=True,
                timeout=120,
            )
            errors = [ln for ln in done.stderr.splitlines() if ln.startswith("Error:")]
            assert done.returncode == 2 and len(errors) == 1, (cmd, done.stderr)
            assert f"is in use by another run: pid {holder.pid}" in errors[0], errors
    finally:
        holder.kill()
        holder.wait()
    assert os.listdir(folder) == ["hctool.lock"]
