"""`hctool launch --inject` with a kind the supervisor carries out: rank-pause stops the rank it
names (and only it) for its ms, then the rank serves again; at the stop launch says how often each
fault fired, as check-consensus does."""

from __future__ import annotations

import signal
import time

import psutil
import requests

from tests.test_launch import Launched


def _status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"


def test_launch_inject_pauses_the_rank_it_names(tmp_path, no_leftover_processes):
    server = Launched(["--tp", "2", "--inject", "rank-pause:rank=1,start_s=1,ms=1500"], tmp_path / "run")
    try:
        url = server.wait_ready()
        ranks = {r: server.rank_pid(r) for r in (0, 1)}
        seen: dict[int, set[str]] = {0: set(), 1: set()}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (psutil.STATUS_STOPPED in seen[1] and _status(ranks[1]) != "stopped"):
            for r, pid in ranks.items():
                seen[r].add(_status(pid))
            time.sleep(0.05)
        assert psutil.STATUS_STOPPED in seen[1] and psutil.STATUS_STOPPED not in seen[0], seen
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        assert requests.post(url + "/generate", json=body, timeout=60).status_code == 200  # continued
        server.proc.send_signal(signal.SIGINT)
        assert server.wait_exit() == -signal.SIGINT  # ends by the signal, after the teardown (docs/contracts.md)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.wait_exit()
    err = "".join(server.stderr)
    assert "fault rank-pause:rank=1,ms=1500,start_s=1: acted on rank 1" in err, err
    assert "fault rank-pause:rank=1,ms=1500,start_s=1 fired 1x (rank 1: 1)" in err, err
    assert server.survivors() == []
