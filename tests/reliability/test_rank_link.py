"""The frontend's link to rank 0 accepts until the real rank connects: connections that fail the
HMAC handshake (garbage bytes, the wrong key, silence) are dropped with a line in the frontend's
log. Before, the first stray connection killed the link's reader thread (or, silent, held its
accept forever): the server never became ready. A real frontend process, real raw sockets on its
link port, and a real multiprocessing client with the right key playing rank 0."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest
import requests

from engine.lab import ServerArgs, contract
from engine.managers.io_struct import ReadyOutput
from hctool.supervise.procs import free_port
from tests.reliability.helpers import REPO, SMALL_ENGINE, Server, child_env


def _connect(port: int, deadline_s: float = 60) -> socket.socket:
    end = time.monotonic() + deadline_s
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            assert time.monotonic() < end, "the frontend never listened on its link port"
            time.sleep(0.02)


def _client_within(port: int, key: bytes, deadline_s: float = 20):
    """multiprocessing's Client (it has no timeout of its own), or the exception it raised;
    fails when the handshake does not finish in time (before: a silent peer held the accept)."""
    out: list = []

    def connect():
        try:
            out.append(Client(("127.0.0.1", port), authkey=key))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    t.join(deadline_s)
    assert out, f"the link's handshake did not finish within {deadline_s} s"
    return out[0]


@pytest.fixture
def frontend(tmp_path):
    ipc, http, key = free_port(), free_port(), os.urandom(16)
    log = open(tmp_path / "frontend.log", "wb")  # noqa: SIM115
    env = {**child_env(), **contract.frontend_env(ServerArgs().to_json(), ipc, key.hex(), "127.0.0.1", http)}
    proc = subprocess.Popen(
        [sys.executable, "-m", contract.FRONTEND_MODULE], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    yield ipc, http, key, tmp_path / "frontend.log"
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


def test_stray_connections_are_dropped_and_rank0_still_connects(frontend):
    ipc, http, key, log = frontend
    silent = _connect(ipc)  # connects and says nothing
    garbage = _connect(ipc)
    garbage.sendall(b"\x00\x00\x00\x10GET / HTTP/1.1\r\n\r\n")  # a length-prefixed message that is no answer
    wrong = _client_within(ipc, b"not the key")
    assert isinstance(wrong, (AuthenticationError, EOFError, ConnectionError)), wrong
    rank0 = _client_within(ipc, key)  # the real one, while the silent peer still waits
    assert not isinstance(rank0, BaseException), rank0
    rank0.send(ReadyOutput(1, 32768, 8000))
    end = time.monotonic() + 30
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{http}/health", timeout=5).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        assert time.monotonic() < end, "not healthy: " + log.read_text()[-2000:]
        time.sleep(0.1)
    text = log.read_text()
    assert text.count("rank link: dropped a connection from 127.0.0.1:") >= 2, text
    assert "rank 0 connected" in text
    silent.close()
    garbage.close()
    rank0.close()


def test_a_launch_with_a_stray_connection_on_its_link_becomes_ready(tmp_path, no_leftover_processes):
    import psutil

    srv = Server(tmp_path / "run", "--tp", "1", *SMALL_ENGINE)
    strays, port, end = [], None, time.monotonic() + 60
    while port is None and time.monotonic() < end:  # find the frontend's link port as it starts
        for p in psutil.Process(srv.proc.pid).children(recursive=True):
            try:
                if contract.FRONTEND_MODULE in " ".join(p.cmdline()):
                    port = int(p.environ()[contract.IPC_PORT_ENV])
            except (psutil.Error, KeyError):
                pass
        time.sleep(0.01)
    assert port is not None
    strays.append(_connect(port))
    strays[-1].sendall(b"\xff" * 64)
    strays.append(_connect(port))  # silent
    try:
        url = srv.wait_ready(120)
        r = requests.post(
            url + "/generate",
            json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3, "temperature": 0}},
            timeout=60,
        )
        assert r.status_code == 200, r.text
    finally:
        for s in strays:
            s.close()
        assert srv.close() == 0
