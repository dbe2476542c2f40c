"""A real `hctool launch` in a subprocess, as a user runs it (black-box: only the
CLI, its stdout and HTTP), with every process it started accounted for."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
SMALL_ENGINE = ["--max-total-tokens", "2048", "--page-size", "16"]
STARTUP_S = 240.0


def child_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("HCTOOL_DEBUG", None)
    return env


def running(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


class Server:
    """`hctool launch --cpu ARGS`; `url` once ready; `close()` stops it and checks
    that nothing it started survives."""

    def __init__(self, run_dir: Path, *args: str):
        self.run_dir = run_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hctool", "launch", "--cpu", "--port", "0", "--run-dir", str(run_dir), *args],
            cwd=REPO,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stdout], daemon=True).start()
        threading.Thread(target=lambda: [self.stderr.append(x) for x in self.proc.stderr], daemon=True).start()
        self.pids: set[int] = set()
        self.url = ""

    def wait_ready(self, deadline_s: float = STARTUP_S) -> str:
        end = time.monotonic() + deadline_s
        while not self.url:
            try:
                line = self.lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                self.close()
                raise AssertionError(f"not ready within {deadline_s} s: {''.join(self.stderr)[-2000:]}") from None
            if line.startswith("ready: "):
                self.url = line.split(" ", 1)[1].strip()
        self.pids = {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        return self.url

    def rank_pid(self, rank: int) -> int:
        for pid in running(self.pids):
            p = psutil.Process(pid)
            if "engine" in " ".join(p.cmdline()) and p.environ().get("RANK") == str(rank):
                return pid
        raise AssertionError(f"no rank {rank} among {self.pids}")

    def close(self, timeout: float = 60.0) -> int:
        """0 when the server stopped as asked (launch ends by the SIGTERM sent here: -15), else its code."""
        asked = self.proc.poll() is None
        if asked:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        end = time.monotonic() + 15
        while running(self.pids) and time.monotonic() < end:
            time.sleep(0.05)
        left = running(self.pids)
        for pid in left:
            psutil.Process(pid).kill()
        assert not left, f"processes left behind: {left}"
        return 0 if asked and code == -signal.SIGTERM else code

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.run_dir.glob("*.log")))


def one_error(proc: subprocess.CompletedProcess, *words: str) -> str:
    """A user mistake as the project promises it: exit 2, one `Error:` line holding `words`, no traceback."""
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]
