"""Ctrl-C during `chaos explore` on a command: the schedules that ran are reported (the table,
report.json with "interrupted"), hctool ends by the signal (130 in a shell), and nothing of the
job is left running."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

PROGRAM = """
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
for i in range(40):
    dist.all_reduce(t)
    time.sleep(0.05)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_reports_what_ran(tmp_path, no_leftover_processes):
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(PROGRAM))
    cmd = [sys.executable, "-m", "hctool", "chaos", "explore", "--budget", "600", "--seed", "3"]
    cmd += ["--artifacts", str(tmp_path / "runs"), "--", str(prog)]
    err = open(tmp_path / "stderr.txt", "w+")
    # a terminal's Ctrl-C goes to the whole foreground group: hctool, torchrun's ranks, all of them
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline:  # the baseline and one schedule done, the next under way
            text = (tmp_path / "stderr.txt").read_text()
            if "chaos: schedule 1 (seed 3)" in text:
                break
            assert proc.poll() is None, text[-3000:]
            time.sleep(0.2)
        else:
            pytest.fail("explore never reached its second schedule")
        time.sleep(1.0)
        tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stderr = (tmp_path / "stderr.txt").read_text()
    # the exit rule for signals (hctool/supervise/signals.py): ended by the signal once reaped (a shell: 130)
    assert proc.returncode == -signal.SIGINT, stderr[-3000:]
    assert "chaos explore: interrupted: 1 schedule(s) ran" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr and "Traceback" not in out
    assert "s3-0" in out  # the table of what ran
    report = json.loads((tmp_path / "runs" / "report.json").read_text())
    assert report["interrupted"] is True and len(report["runs"]) == 1, report
    assert not [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
