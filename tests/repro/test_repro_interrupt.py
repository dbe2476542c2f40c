"""Ctrl-C and SIGTERM during `hctool repro` leave no process behind."""

from __future__ import annotations

import signal
import subprocess
import time

import psutil
import pytest

SCENARIO = """
id = "tiny"
title = "a small healthy scenario"
[engine]
flags = ["--max-total-tokens", "2048"]
[workload]
prefix_tokens = 64
requests_per_round = 4
rounds = 50
[[variants]]
name = "default"
expected = ["healthy"]
"""


def _is_rank(p: psutil.Process) -> bool:
    try:
        return "engine.rank" in " ".join(p.cmdline())
    except psutil.Error:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_reaps_every_process(hctool_cmd, clean_env, tmp_path, sig):
    (tmp_path / "cat" / "tiny").mkdir(parents=True)
    (tmp_path / "cat" / "tiny" / "scenario.toml").write_text(SCENARIO)
    proc = subprocess.Popen(
        hctool_cmd + ["repro", "tiny", "--catalogue", str(tmp_path / "cat"), "--artifacts", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env,
    )
    seen: set[int] = set()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:  # wait until the ranks of a topology run
            kids = psutil.Process(proc.pid).children(recursive=True)
            seen |= {k.pid for k in kids}
            if sum(_is_rank(k) for k in kids) == 2:
                break
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.2)
        else:
            pytest.fail("ranks did not start")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -sig, err  # ends by the signal, after the teardown (docs/contracts.md)
    assert "Traceback" not in err
    alive = [p for p in seen if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left behind: {alive}"
