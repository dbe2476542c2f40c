"""No orphans: whatever happens to hctool, even SIGKILL, every process it started
exits (hctool/agent/lifeline.py). Real hctool processes, real SIGKILL."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from hctool.supervise.procs import free_port, inject_env
from tests.reliability.helpers import REPO, child_env, running

PROGRAMS = Path(__file__).resolve().parent / "programs"
GONE_DEADLINE_S = 15.0  # lifeline: SIGTERM at once, SIGKILL 3 s later; a hang check, not a timing claim


def _wait_gone(pids: set[int]) -> float:
    """Seconds until none of `pids` runs; kills survivors and fails after the deadline."""
    start = time.monotonic()
    while running(pids):
        if time.monotonic() - start > GONE_DEADLINE_S:
            left = running(pids)
            for pid in left:
                psutil.Process(pid).kill()
            pytest.fail(f"orphans {GONE_DEADLINE_S} s after hctool died: {left}")
        time.sleep(0.05)
    return time.monotonic() - start


def _tree(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _is_engine(pid: int) -> bool:
    try:
        return "engine" in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def _sigkill_and_reap(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


class _Lines:
    """stdout lines of a child, readable with a deadline."""

    def __init__(self, stream):
        self.q: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.q.put(line) for line in stream], daemon=True).start()

    def wait_for(self, prefix: str, deadline_s: float) -> str:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            try:
                line = self.q.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            if line.startswith(prefix):
                return line
        raise AssertionError(f"no line starting with {prefix!r} within {deadline_s} s")


@pytest.mark.parametrize("when", ["starting", pytest.param("ready", marks=pytest.mark.slow)])
def test_sigkill_of_launch_leaves_no_process(tmp_path, when):
    """`starting`: killed once its 3 processes run (the watch starts before any
    engine import, so this is the same mechanism, without the wait for torch);
    `ready`: killed while serving."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hctool",
            "launch",
            "--cpu",
            "--port",
            "0",
            "--tp",
            "2",
            "--run-dir",
            str(tmp_path),
            "--max-total-tokens",
            "2048",
            "--page-size",
            "16",
        ],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        if when == "ready":
            _Lines(proc.stdout).wait_for("ready: ", 240)
        else:
            end = time.monotonic() + 120
            while sum(_is_engine(p) for p in _tree(proc.pid)) < 3:
                assert proc.poll() is None and time.monotonic() < end, "no topology started"
                time.sleep(0.05)
            time.sleep(1.0)  # past sitecustomize in each
        pids = _tree(proc.pid)
        assert len(pids) >= 3, "frontend and two ranks expected"
    except BaseException:
        pids = _tree(proc.pid)
        _sigkill_and_reap(proc)
        _wait_gone(pids)
        raise
    _sigkill_and_reap(proc)
    _wait_gone(pids)
    assert "supervisor" in (tmp_path / "rank1.log").read_text()


@pytest.mark.slow  # the launch case covers the mechanism in the default run
def test_sigkill_of_check_consensus_run_torchrun_leaves_no_process(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "hctool",
        "check-consensus",
        "run",
        "--timeout",
        "300",
        "--hang-after",
        "60",
        "--trace-dir",
        str(tmp_path / "trace"),
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(PROGRAMS / "forever.py"),
    ]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = tmp_path / "trace" / "cmd.log"
    try:  # wait for both workers (torchrun's grandchildren of hctool) to run collectives
        end = time.monotonic() + 120
        while not (log.exists() and log.read_text().count(" running") == 2):
            assert proc.poll() is None and time.monotonic() < end, "workers did not start"
            time.sleep(0.1)
        pids = _tree(proc.pid)
        assert len(pids) >= 3, "torchrun's agent and two workers expected"
    except BaseException:
        pids = _tree(proc.pid)
        _sigkill_and_reap(proc)
        _wait_gone(pids)
        raise
    _sigkill_and_reap(proc)
    _wait_gone(pids)


SUPERVISOR = """
import os, subprocess, sys, time
from hctool.supervise.procs import inject_env
child = "import os, time; os.fork(); print(os.getpid(), flush=True); time.sleep(300)"
subprocess.Popen([sys.executable, "-c", child], env=inject_env(dict(os.environ)), start_new_session=True)
time.sleep(300)
"""


def test_forked_grandchildren_exit_with_a_plain_supervisor():
    sup = subprocess.Popen([sys.executable, "-c", SUPERVISOR], env=child_env())
    try:
        end = time.monotonic() + 60
        while len(_tree(sup.pid)) < 2:  # the child and the child it forked
            assert time.monotonic() < end, "children did not start"
            time.sleep(0.05)
        pids = _tree(sup.pid)
    except BaseException:
        pids = _tree(sup.pid)
        _sigkill_and_reap(sup)
        _wait_gone(pids)
        raise
    _sigkill_and_reap(sup)
    _wait_gone(pids)


def test_supervisor_already_gone_exits_at_start():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    env = inject_env(child_env())
    env["HCTOOL_SUPERVISOR_PID"] = str(dead.pid)
    res = subprocess.run(
        [sys.executable, "-c", "import time; time.sleep(60); print('survived')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == -signal.SIGTERM and "survived" not in res.stdout
    assert f"supervisor (pid {dead.pid}) is gone" in res.stderr


@pytest.mark.slow
def test_sigkill_of_repro_leaves_no_process(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "hctool", "repro", "30760", "--variant", "bulk", "--artifacts", str(tmp_path)],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:  # wait until a topology (frontend + 2 ranks) runs under it
        end = time.monotonic() + 120
        while sum(_is_engine(p) for p in _tree(proc.pid)) < 3:
            assert proc.poll() is None and time.monotonic() < end, "no topology started"
            time.sleep(0.1)
        time.sleep(1.0)
    finally:
        pids = _tree(proc.pid)
        _sigkill_and_reap(proc)
        _wait_gone(pids)
