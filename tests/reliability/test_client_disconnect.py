"""Clients that go away: their requests are aborted on every rank in one tick (the frontend sends
an AbortReq that rank 0 broadcasts with the tick's requests, as SGLang aborts on disconnect), so
nothing decodes for nobody; `--max-queued-requests` answers 503 beyond its bound. A real
`hctool launch --tp 2` with --state-digest (the ranks compare their replicated state every tick:
an abort applied at different ticks would stop them), real sockets closed mid-request."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import requests

from tests.reliability.helpers import SMALL_ENGINE, Server

LONG = 1500  # tokens each abandoned request asks for
HICACHE = ["--enable-hierarchical-cache", "--hicache-ratio", "4", "--state-digest"]


def _send_and_leave(url: str, ids: list[int], max_new: int, stay_s: float) -> None:
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}
    ).encode()
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    time.sleep(stay_s)
    s.close()  # gone before the answer


def _counter(url: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", requests.get(url + "/metrics", timeout=30).text, re.M)[1])


def _settled(url: str, name: str, quiet_s: float = 1.5, deadline_s: float = 90) -> float:
    """The counter once it stopped moving for quiet_s."""
    end, last, since = time.monotonic() + deadline_s, None, time.monotonic()
    while time.monotonic() < end:
        now = _counter(url, name)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now
        time.sleep(0.1)
    raise AssertionError(f"{name} still moving after {deadline_s} s")


def test_abandoned_requests_are_aborted_on_every_rank(tmp_path, no_leftover_processes):
    srv = Server(tmp_path / "run", "--tp", "2", *SMALL_ENGINE, *HICACHE)
    try:
        url = srv.wait_ready()
        before = _counter(url, "generation_tokens_total")
        clients = [threading.Thread(target=_send_and_leave, args=(url, [10 + i, 20, 30], LONG, 0.5)) for i in range(8)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        generated = _settled(url, "generation_tokens_total") - before
        assert generated < 8 * LONG / 4, f"{generated:.0f} tokens decoded for clients that had left"
        r = requests.post(
            url + "/generate",
            json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
            timeout=60,
        )
        assert r.status_code == 200 and len(r.json()["output_ids"]) <= 8, r.text
        assert requests.get(url + "/health", timeout=10).status_code == 200
        assert "StateDiverged" not in srv.log()
    finally:
        assert srv.close() == 0, srv.log()[-3000:]


def test_max_queued_requests_answers_503_beyond_the_bound(tmp_path, no_leftover_processes):
    srv = Server(
        tmp_path / "run", "--tp", "1", *SMALL_ENGINE, "--max-running-requests", "1", "--max-queued-requests", "2"
    )
    try:
        url = srv.wait_ready()
        busy = threading.Thread(target=_send_and_leave, args=(url, [7, 8, 9], LONG, 3.0))
        busy.start()  # occupies the one running slot, then leaves (and is aborted)
        time.sleep(1.0)
        statuses: list[int] = []

        def one(i: int) -> None:
            r = requests.post(
                url + "/generate",
                json={"input_ids": [40 + i, 41], "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
                timeout=120,
            )
            statuses.append(r.status_code)
            if r.status_code == 503:
                assert r.json()["error"] == "The request queue is full."

        waiting = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in waiting:
            t.start()
        for t in waiting:
            t.join()
        busy.join()
        assert sorted(statuses) == [200, 200, 503], statuses
    finally:
        assert srv.close() == 0, srv.log()[-3000:]
