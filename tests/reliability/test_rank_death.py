"""A rank's death: every in-flight request gets a 503 within about a second (never
a hang, never a dropped connection), and `hctool launch` names the rank and exits 1.
The default run kills rank 1 of the probe server at the end of test_http_probes.py
(one server start less); here rank 0 and rank 1 on servers of their own (slow)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import requests

from tests.reliability.helpers import SMALL_ENGINE, Server

IN_FLIGHT = 6
ANSWER_DEADLINE_S = 10.0  # a hang check, not a timing claim: the figure is in docs/reliability.md


def kill_rank_with_requests_in_flight(srv: Server, rank: int) -> None:
    answers: dict[int, tuple[int | str, float]] = {}

    def client(i: int) -> None:
        body = {"input_ids": [7 + i] * 24, "sampling_params": {"max_new_tokens": 1900, "ignore_eos": True}}
        try:
            code: int | str = requests.post(srv.url + "/generate", json=body, timeout=120).status_code
        except requests.RequestException as exc:
            code = type(exc).__name__
        answers[i] = (code, time.monotonic())

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(IN_FLIGHT)]
    for t in threads:
        t.start()
    time.sleep(1.5)  # every request admitted and decoding
    assert not answers, f"requests finished before the kill: {answers}"
    killed_at = time.monotonic()
    os.kill(srv.rank_pid(rank), signal.SIGKILL)
    for t in threads:
        t.join(ANSWER_DEADLINE_S + 5)
    assert sorted(answers) == list(range(IN_FLIGHT)), "clients still waiting"
    assert {code for code, _ in answers.values()} == {503}, answers
    assert max(when for _, when in answers.values()) - killed_at < ANSWER_DEADLINE_S
    assert srv.proc.wait(timeout=60) == 1
    assert f"Error: rank {rank} died (killed by SIGKILL)" in "".join(srv.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_in_flight_requests_get_503_when_a_rank_dies(tmp_path, rank):
    srv = Server(tmp_path / "run", "--tp", "2", *SMALL_ENGINE)
    try:
        srv.wait_ready()
        kill_rank_with_requests_in_flight(srv, rank)
    finally:
        srv.close()
