"""Ctrl-C of `check-consensus run` (and SIGTERM, SIGHUP: one path) stops the job, reaps every
process of its tree, then says what was seen so far: the ranks, the calls per rank, the live
finding if there was one, the run folder; hctool then ends by the signal (a shell reads 130).
Before: nothing of what was seen was said. Real processes, a real gloo group, a real SIGINT."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

LOOP = """
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
step = 0
while True:
    if rank == 1 and step == 5 and os.environ.get("STALL"):
        print("rank 1 stalls", flush=True)
        time.sleep(600)  # rank 0 waits in its all_reduce: a hang, seen live
    dist.all_reduce(t)
    print(f"rank {rank} step {step}", flush=True)
    step += 1
    time.sleep(0.05)
"""


def _wait_for(path: Path, text: str, proc: subprocess.Popen, deadline_s: float = 90) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if text in path.read_text(errors="replace"):
            return
        assert proc.poll() is None, f"hctool ended ({proc.returncode}) before {text!r}:\n{path.read_text()[-3000:]}"
        time.sleep(0.1)
    raise AssertionError(f"{text!r} never came:\n{path.read_text()[-3000:]}")


def _interrupt(tmp_path: Path, target: list[str], wait_for: str, **env: str) -> tuple[int, str, set[int]]:
    """Start the command, wait for `wait_for` on its stderr, Ctrl-C it: (returncode, stderr, the
    pids of its whole tree just before the signal)."""
    (tmp_path / "loop.py").write_text(LOOP)
    err = tmp_path / "stderr.txt"
    cmd = [sys.executable, "-m", "hctool", "check-consensus", "run", "--hang-after", "1"]
    cmd += ["--on-divergence", "report", "--timeout", "300", "--trace-dir", str(tmp_path / "t"), "--", *target]
    child_env = dict(os.environ, **env)
    child_env.pop("HCTOOL_DEBUG", None)
    with open(err, "w") as stderr, open(tmp_path / "stdout.txt", "w") as stdout:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=child_env, stdout=stdout, stderr=stderr)
    try:
        _wait_for(err, wait_for, proc)
        tree = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        proc.send_signal(
            signal.SIGINT
        )  # what a terminal's Ctrl-C sends hctool (its ranks are in sessions of their own)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    end = time.monotonic() + 10
    while [p for p in tree if psutil.pid_exists(p)] and time.monotonic() < end:
        time.sleep(0.1)
    return proc.returncode, err.read_text(), {p for p in tree if psutil.pid_exists(p)}


@pytest.mark.timeout(200)
def test_ctrl_c_reaps_the_job_and_says_what_was_seen(tmp_path, no_leftover_processes):
    code, stderr, left = _interrupt(tmp_path, ["loop.py"], "hctool: hung:", STALL="1")
    assert code == -signal.SIGINT, stderr[-3000:]  # ends by the signal: a shell reads 130
    assert left == set(), f"processes left: {left}"
    summary = stderr[stderr.index("hctool: interrupted after") :]
    assert "the job is stopped, every process reaped" in summary
    calls = re.search(r"seen so far: 2 rank\(s\); calls per rank: rank 0: (\d+) .*; rank 1: (\d+) ", summary)
    assert calls and (int(calls[1]), int(calls[2])) == (6, 5), summary  # rank 0 waits in its 6th call
    assert "found live: hung: cause: rank 1 never reached the all_reduce at loop.py:" in summary
    assert f"traces in {tmp_path / 't'}" in summary
    assert "Traceback" not in stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_under_torchrun_shows_no_teardown_traceback(tmp_path, no_leftover_processes):
    """torchrun answers hctool's SIGTERM with its SignalException traceback (kept in cmd.log, not shown)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "loop.py"]
    code, stderr, left = _interrupt(tmp_path, torchrun, "rank 1 step 10")
    assert code == -signal.SIGINT, stderr[-3000:]
    assert left == set(), f"processes left: {left}"
    assert re.search(r"seen so far: 2 rank\(s\); calls per rank: rank 0: \d+ ", stderr), stderr[-2000:]
    assert "no divergence or hang seen so far" in stderr
    assert "SignalException" not in stderr and "Traceback" not in stderr
    log = (tmp_path / "t" / "cmd.log").read_text()  # kept whole, with hctool's note where it ended the job
    note = log.index("[hctool] hctool ends the job here")
    assert "SignalException" not in log or log.index("SignalException") > note
