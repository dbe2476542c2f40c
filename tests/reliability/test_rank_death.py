"""A rank's death: every in-flight request gets a 503 within about a second (never
a hang, never a dropped connection), and `hctool launch` names the rank and exits 1."""

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


@pytest.mark.parametrize("rank", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_in_flight_requests_get_503_when_a_rank_dies(tmp_path, rank):
    srv = Server(tmp_path / "run", "--tp", "2", *SMALL_ENGINE)
    try:
        url = srv.wait_ready()
        answers: dict[int, tuple[int | str, float]] = {}

        def client(i: int) -> None:
            body = {"input_ids": [7 + i] * 24, "sampling_params": {"max_new_tokens": 1900, "ignore_eos": True}}
            try:
                code: int | str = requests.post(url + "/generate", json=body, timeout=120).status_code
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
        slowest = max(when for _, when in answers.values()) - killed_at
        assert slowest < ANSWER_DEADLINE_S
        assert srv.proc.wait(timeout=60) == 1
        stderr = "".join(srv.stderr)
        assert f"Error: rank {rank} died (killed by SIGKILL)" in stderr
    finally:
        srv.close()
