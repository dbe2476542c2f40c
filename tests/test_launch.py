"""`hctool launch` and hctool.launch.Topology: startup, teardown, rank death.

Real processes (frontend + 2 real engine ranks over gloo), real HTTP. Every test
collects the pids of the topology while it runs and checks none survives.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests

from tests.reliability.helpers import running

REPO = Path(__file__).resolve().parents[1]
# Small pools so the ranks start fast on a shared 2-core machine.
SMALL_ENGINE = ["--max-total-tokens", "2048", "--page-size", "16"]
READY_RE = re.compile(r"^ready: (http://127\.0\.0\.1:\d+)$")
STARTUP_DEADLINE = 240.0


class Launched:
    """A running `hctool launch` subprocess; stdout and stderr collected by threads."""

    def __init__(self, args: list[str], run_dir: Path, port: int | None = 0):
        pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath}
        env.pop("HCTOOL_DEBUG", None)
        self.run_dir = run_dir
        self.proc = subprocess.Popen(
            # port 0 (a free one) unless a test asks: launch serves on SGLang's 30000 by default, and
            # tests run side by side
            [sys.executable, "-m", "hctool", "launch", "--cpu", *(() if port is None else ("--port", str(port)))]
            + ["--run-dir", str(run_dir), *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout_lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        threading.Thread(
            target=self._pump, args=(self.proc.stdout, self.stdout, self.stdout_lines), daemon=True
        ).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr, None), daemon=True).start()
        self.pids: set[int] = set()

    @staticmethod
    def _pump(stream, sink: list[str], lines: queue.Queue | None) -> None:
        for line in stream:
            sink.append(line)
            if lines is not None:
                lines.put(line)

    def wait_ready(self, deadline_s: float = STARTUP_DEADLINE) -> str:
        try:
            line = self.stdout_lines.get(timeout=deadline_s)
        except queue.Empty:
            raise AssertionError(f"no ready line within {deadline_s} s; stderr: {''.join(self.stderr)}") from None
        match = READY_RE.match(line.rstrip("\n"))
        assert match, f"unexpected first stdout line {line!r}"
        self.collect_pids()
        return match.group(1)

    def collect_pids(self) -> None:
        with_children = psutil.Process(self.proc.pid).children(recursive=True)
        self.pids |= {p.pid for p in with_children}

    def rank_pid(self, rank: int) -> int:
        for pid in self.pids:
            try:
                p = psutil.Process(pid)
                if "engine.rank" in p.cmdline() and p.environ().get("RANK") == str(rank):
                    return pid
            except psutil.NoSuchProcess:
                continue
        raise AssertionError(f"no process of rank {rank} among {self.pids}")

    def wait_exit(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"hctool launch did not exit within {timeout} s") from None

    def survivors(self) -> list[int]:
        return running(self.pids)

    def kill(self) -> None:
        """Last-resort cleanup so a failing test leaves nothing behind."""
        for pid in [self.proc.pid, *self.pids]:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait(timeout=10)


@pytest.fixture
def launch(tmp_path, no_leftover_processes):
    started: list[Launched] = []

    def start(*args: str) -> Launched:
        launched = Launched([*SMALL_ENGINE, *args], tmp_path / f"run{len(started)}")
        started.append(launched)
        return launched

    yield start
    for launched in started:
        if launched.proc.poll() is None:
            launched.kill()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ready_then_signal_tears_everything_down(launch, sig):
    server = launch("--tp", "2")
    url = server.wait_ready()
    assert requests.get(url + "/health", timeout=10).status_code == 200
    assert len(server.pids) >= 3, "frontend and two ranks expected"
    for name in ("frontend.log", "rank0.log", "rank1.log"):
        assert (server.run_dir / name).exists()

    server.proc.send_signal(sig)
    assert server.wait_exit() == -sig  # ends by the signal, after the teardown (docs/contracts.md)
    assert server.survivors() == []
    assert server.stdout == [f"ready: {url}\n"], "stdout carries only the ready line"
    assert str(server.run_dir) in "".join(server.stderr)


def test_killed_rank_is_named_and_everything_goes(launch):
    server = launch("--tp", "2")
    server.wait_ready()
    os.kill(server.rank_pid(1), signal.SIGKILL)

    assert server.wait_exit() == 1
    assert server.survivors() == []
    stderr = "".join(server.stderr)
    assert "Error: rank 1 died (killed by SIGKILL)" in stderr
    assert str(server.run_dir / "rank1.log") in stderr


def test_startup_timeout_exits_2_with_a_hint_and_leaves_nothing(launch):
    server = launch("--tp", "2", "--startup-timeout", "0.5")
    # Collect pids while startup runs; the deadline passes long before the ranks are up.
    while server.proc.poll() is None:
        server.collect_pids()
        time.sleep(0.05)
    assert server.wait_exit() == 2
    stderr = "".join(server.stderr)
    assert "Error: not ready after 0.5 s" in stderr and "Hint: raise --startup-timeout" in stderr
    assert "Traceback" not in stderr and server.survivors() == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tp", "3"], "must divide"),
        (["--max-total-tokens", "abc"], "invalid int value"),
        (["--no-such-flag"], "unrecognized arguments"),
        (["--device", "cuda"], "--device is set by launch"),
        (["--port", "70000"], "--port must be between 0 and 65535"),
    ],
)
def test_usage_errors_exit_2_with_one_line(hctool_cmd, clean_env, tmp_path, args, message):
    clean_env["PYTHONPATH"] = str(REPO)
    res = subprocess.run(
        [*hctool_cmd, "launch", "--cpu", "--run-dir", str(tmp_path), *args],
        cwd=REPO,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr.startswith("Error: ") and message in res.stderr.splitlines()[0]
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_bad_inject_spec_is_a_usage_error(hctool_cmd, clean_env, tmp_path):
    pytest.importorskip("hctool.protocol.faults")
    clean_env["PYTHONPATH"] = str(REPO)
    res = subprocess.run(
        [*hctool_cmd, "launch", "--cpu", "--run-dir", str(tmp_path), "--inject", "no-such-fault:ms=1"],
        cwd=REPO,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and res.stderr.startswith("Error: bad --inject 'no-such-fault:ms=1'")


def test_help_lists_engine_flags(hctool_cmd, clean_env):
    clean_env.update(PYTHONPATH=str(REPO), COLUMNS="200")
    res = subprocess.run(
        [*hctool_cmd, "launch", "--help"], cwd=REPO, env=clean_env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0
    for flag in ("--tp", "--inject", "--enable-hierarchical-cache", "--hicache-write-policy", "--prefetch-vote"):
        assert flag in res.stdout


def test_topology_api_reports_pids_and_deaths(tmp_path, no_leftover_processes):
    from engine.server_args import ServerArgs
    from hctool.launch import Topology

    args = ServerArgs.from_cli(SMALL_ENGINE, tp_size=2)
    with Topology(args, tmp_path, extra_env={"HCTOOL_TEST_MARK": "1"}) as topo:
        url = topo.start(timeout=STARTUP_DEADLINE)
        assert requests.get(url + "/health", timeout=10).status_code == 200
        pids = topo.pids_by_rank()
        assert sorted(pids) == [0, 1]
        assert psutil.Process(pids[1]).environ()["HCTOOL_TEST_MARK"] == "1"
        assert topo.dead() == []
        # A long request is in flight when rank 0 dies: its client gets a 503, not a hang.
        answers: list[int] = []
        long_request = threading.Thread(
            target=lambda: answers.append(
                requests.post(
                    url + "/generate",
                    json={"input_ids": [5] * 16, "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}},
                    timeout=120,
                ).status_code
            )
        )
        long_request.start()
        time.sleep(0.5)
        os.kill(pids[0], signal.SIGKILL)
        death = topo.wait_for_death(timeout=60)
        assert (death.name, death.returncode) == ("rank 0", -signal.SIGKILL)
        long_request.join(timeout=60)
        assert answers == [503]
        # The frontend lost rank 0: it must say so instead of hanging clients.
        deadline = time.monotonic() + 30
        while requests.get(url + "/health", timeout=10).status_code != 503:
            assert time.monotonic() < deadline, "/health still 200 after rank 0 died"
            time.sleep(0.1)
        assert requests.post(url + "/generate", json={"input_ids": [1, 2]}, timeout=10).status_code == 503
    assert not any(psutil.pid_exists(p) for p in pids.values())
    assert set(topo.log_paths) == {"frontend", "rank 0", "rank 1"}


def test_port_in_use_is_a_usage_error(hctool_cmd, clean_env, tmp_path):
    clean_env["PYTHONPATH"] = str(REPO)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run(
            [*hctool_cmd, "launch", "--cpu", "--run-dir", str(tmp_path), "--port", str(port)],
            cwd=REPO,
            env=clean_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert res.returncode == 2 and res.stderr.startswith(f"Error: port {port} on 127.0.0.1 is in use")
    assert "--port" in res.stderr and "Traceback" not in res.stderr


def test_start_retries_when_another_job_takes_a_port(tmp_path, monkeypatch, no_leftover_processes):
    """Ports are picked free, then bound a moment later; on a shared host another job can
    take one in between. Here the first rendezvous port is held by a listener: rank 0
    fails with EADDRINUSE, and start() retries on fresh ports instead of failing."""
    from engine.server_args import ServerArgs
    from hctool.launch import Topology, topology

    picks: list[list[int]] = []
    real = topology._distinct_free_ports

    def ports(n: int) -> list[int]:
        picks.append(real(n))
        if len(picks) == 1:
            picks[0][1] = busy.getsockname()[1]  # [ipc, master, http]: the master port is taken
        return picks[-1]

    monkeypatch.setattr(topology, "_distinct_free_ports", ports)
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        with Topology(ServerArgs.from_cli(SMALL_ENGINE, tp_size=2), tmp_path) as topo:
            url = topo.start(timeout=STARTUP_DEADLINE)
            assert requests.get(url + "/health", timeout=10).status_code == 200
    assert len(picks) == 2
    failed = (tmp_path / "rank0.try1.log").read_text().lower()
    assert "address already in use" in failed or "eaddrinuse" in failed
