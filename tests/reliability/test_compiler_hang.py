"""A compiler that hangs (CXX=a script that never ends) while `check-consensus run` builds its
C++ capture kernel: the build is bounded by the run's --timeout, and on a timeout, a SIGTERM or
a SIGKILL of hctool the compiler's processes are gone and no partial .so is left in the cache."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.helpers import REPO, child_env, running

TICKER = str(REPO / "tests" / "consensus" / "programs" / "ticker.py")
HANG = """#!/bin/sh
echo $$ >> "{pids}"
sleep 300 &
echo $! >> "{pids}"
wait
"""


@pytest.fixture
def hanging_compiler(tmp_path):
    pids = tmp_path / "compiler.pids"
    script = tmp_path / "hang-c++"
    script.write_text(HANG.format(pids=pids))
    script.chmod(0o755)
    env = {**child_env(), "CXX": str(script), "HCTOOL_CACHE_DIR": str(tmp_path / "cache"), "TICKER_SECONDS": "1"}
    env.pop("HCTOOL_C10D_KERNEL", None)
    return env, pids, tmp_path / "cache"


def _start(env, tmp_path: Path, timeout: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hctool",
            "check-consensus",
            "run",
            "--nproc",
            "1",
            "--timeout",
            timeout,
            "--trace-dir",
            str(tmp_path / "trace"),
            "--",
            TICKER,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _compiler_pids(pids: Path, deadline_s: float = 60) -> list[int]:
    end = time.monotonic() + deadline_s
    while not (pids.exists() and len(pids.read_text().split()) >= 2):
        assert time.monotonic() < end, "the compiler script never started"
        time.sleep(0.05)
    return [int(p) for p in pids.read_text().split()]


def _assert_gone(pids: list[int], cache: Path, deadline_s: float = 15) -> None:
    end = time.monotonic() + deadline_s
    while running(pids) and time.monotonic() < end:
        time.sleep(0.05)
    left = running(pids)
    for pid in left:
        subprocess.run(["kill", "-9", str(pid)], check=False)
    assert not left, f"compiler processes left running: {left}"
    assert not list(cache.rglob("*.tmp")), f"partial files in the cache: {list(cache.rglob('*.tmp'))}"


def test_the_build_is_bounded_by_the_run_timeout(hanging_compiler, tmp_path, no_leftover_processes):
    env, pids, cache = hanging_compiler
    proc = _start(env, tmp_path, "6")
    try:
        out, err = proc.communicate(timeout=90)  # before: the build alone waited 600 s
    finally:
        proc.kill()
    assert "the build took over 6 s" in err, err
    _assert_gone(_compiler_pids(pids, 1), cache)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_to_hctool_during_the_build_leaves_no_compiler_and_no_partial_file(
    hanging_compiler, tmp_path, sig, no_leftover_processes
):
    env, pids, cache = hanging_compiler
    proc = _start(env, tmp_path, "120")
    try:
        compiler = _compiler_pids(pids)
        proc.send_signal(sig)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    _assert_gone(compiler, cache)
