"""One exit rule for signals (docs/contracts.md): a command stopped by SIGINT, SIGTERM or SIGHUP
reaps what it started, then ends by that signal, so a shell reads 128 + N and a shell loop stops
on Ctrl-C. Before: `launch` exited 0 and `check-consensus run` 130 (bash runs the next command
of a loop after a child that exits 130). Real hctool processes, real signals, real bash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.reliability.helpers import REPO, SMALL_ENGINE, Server, child_env, running

FOREVER = str(Path(__file__).resolve().parent / "programs" / "forever.py")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_launch_ends_by_the_signal_that_stopped_it(tmp_path, sig, no_leftover_processes):
    srv = Server(tmp_path / "run", "--tp", "1", *SMALL_ENGINE)
    srv.wait_ready()
    srv.proc.send_signal(sig)
    assert srv.proc.wait(timeout=60) == -sig
    end = time.monotonic() + 15
    while running(srv.pids) and time.monotonic() < end:
        time.sleep(0.05)
    assert running(srv.pids) == []


def _ranks_running(proc: subprocess.Popen, n: int = 2, deadline_s: float = 90) -> set[int]:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        kids = [p for p in psutil.Process(proc.pid).children(recursive=True) if "forever.py" in " ".join(p.cmdline())]
        if len(kids) >= n:
            return {k.pid for k in kids}
        time.sleep(0.1)
    raise AssertionError("the ranks did not start")


def test_check_consensus_run_ends_by_sigterm(tmp_path, no_leftover_processes):
    proc = subprocess.Popen(
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
            "--trace-dir",
            str(tmp_path / "trace"),
            "--",
            FOREVER,
        ],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ranks = _ranks_running(proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, err
    assert "Traceback" not in err and running(ranks) == []


def test_ctrl_c_stops_a_shell_loop_of_hctool_runs(tmp_path, no_leftover_processes):
    """Ctrl-C reaches the terminal's process group: bash and hctool. bash stops its loop only if
    the child died of SIGINT (it goes on after a child that exited 130)."""
    loop = (
        f"for i in 1 2; do {sys.executable} -m hctool check-consensus run --nproc 2 --timeout 15 "
        f"--trace-dir {tmp_path}/trace$i -- {FOREVER}; done; echo LOOP-WENT-ON"
    )
    bash = subprocess.Popen(
        ["bash", "-c", loop],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        ranks = _ranks_running(bash)
        os.killpg(bash.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, err = bash.communicate(timeout=60)
    finally:
        if bash.poll() is None:
            os.killpg(bash.pid, signal.SIGKILL)
            bash.wait()
    assert "LOOP-WENT-ON" not in out and not (tmp_path / "trace2").exists(), err[-2000:]
    assert bash.returncode == -signal.SIGINT
    assert running(ranks) == []
