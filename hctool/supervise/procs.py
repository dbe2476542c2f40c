"""Process plumbing shared by launch, check-consensus run and repro.

Every child is started as a fresh interpreter in its own session (so a terminal
Ctrl-C reaches only hctool, which then tears the tree down in order) and every
child tree is reaped with psutil, on success, failure, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from hctool.protocol import env as protocol_env
from hctool.protocol.safefile import open_append
from hctool.supervise.signals import deferred

AGENT_SITE_DIR = Path(__file__).resolve().parents[1] / "agent" / "site"  # holds sitecustomize.py only


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """A process that runs (a zombie has ended; only its parent has not reaped it yet)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def kill_tree(pid: int, timeout: float = 5.0) -> None:
    """SIGTERM a process and all its descendants, then SIGKILL what is left."""
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=timeout)


_STARTED: set[int] = set()  # pids of every ProcessSet's children still running (all sets of this process)


def adopt_orphans() -> None:
    """Make this process the child subreaper (Linux prctl PR_SET_CHILD_SUBREAPER): a process that
    a rank started in a session of its own (start_new_session, a daemon's double fork) and left
    behind when the rank ended is re-parented to hctool instead of init, so the teardown still
    finds it (kill_leftovers). Without it such a helper outlived the run: killing each child's
    session or tree misses a process that left both. A no-op where prctl is not available."""
    global _SUBREAPER
    if _SUBREAPER:
        return
    _SUBREAPER = True
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


_SUBREAPER = False


def kill_leftovers(timeout: float = 5.0) -> list[int]:
    """Kill (with their trees) the processes re-parented to hctool that descend from what it
    started: a direct child of this process, not one a ProcessSet started and still holds, whose
    environment carries HCTOOL_SUPERVISOR_PID naming this process (inherited from a rank). A
    helper that cleared its environment is not recognised: docs/reliability.md says so."""
    me = str(os.getpid())
    found = []
    try:
        kids = psutil.Process().children()
    except psutil.Error:
        return []
    for p in kids:
        if p.pid in _STARTED:
            continue
        with contextlib.suppress(psutil.Error):
            if p.environ().get(protocol_env.SUPERVISOR_PID) == me:
                found.append(p.pid)
    for pid in found:
        kill_tree(pid, timeout=timeout)
    return found


def torchrun_env(
    rank: int, world_size: int, master_addr: str, master_port: int, local_rank: int | None = None
) -> dict[str, str]:
    """The variables torchrun sets for one worker."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def inject_env(env: dict[str, str], **hctool_vars: str) -> dict[str, str]:
    """Put hctool's agent/site/ first on PYTHONPATH so its sitecustomize loads in every
    Python process started with this environment, and set HCTOOL_* variables
    (hctool/protocol/env.py; a key without the prefix gets it: TRACE_DIR=...)."""
    env = dict(env)
    env[protocol_env.SUPERVISOR_PID] = str(os.getpid())  # children exit when we die (agent/lifeline.py)
    parts = [str(AGENT_SITE_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    for key, value in hctool_vars.items():
        env[key if key.startswith("HCTOOL_") else f"HCTOOL_{key.upper()}"] = str(value)
    return env


@dataclass
class Child:
    name: str
    popen: subprocess.Popen
    log_path: Path | None = None


@dataclass
class ProcessSet:
    """Named child processes that are always reaped together (use as a context manager)."""

    children: list[Child] = field(default_factory=list)

    def start(
        self,
        name: str,
        cmd: list[str],
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        cwd: str | None = None,
        stdout_path: Path | None = None,
    ) -> Child:
        """log_path takes stdout and stderr, unless stdout_path is given for stdout alone."""
        stdout = stderr = None
        # Logs go into run folders others may write into: never through a planted link or FIFO.
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            stdout = open(open_append(log_path), "ab", buffering=0)  # noqa: SIM115 - closed with the child
            stderr = subprocess.STDOUT
        if stdout_path is not None:
            stderr = stdout if stdout is not None else None
            stdout = open(open_append(stdout_path), "ab", buffering=0)  # noqa: SIM115 - closed with the child
        try:
            adopt_orphans()
            with deferred():  # Ctrl-C/SIGTERM between the fork and the append would orphan the child
                popen = subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=cwd,
                    stdout=stdout,
                    stderr=stderr,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
                child = Child(name, popen, log_path)
                self.children.append(child)
                _STARTED.add(popen.pid)
        finally:
            for f in (stdout, stderr):
                if f is not None and f is not subprocess.STDOUT:
                    f.close()
        return child

    def dead(self) -> list[Child]:
        return [c for c in self.children if c.popen.poll() is not None]

    def alive(self) -> list[Child]:
        return [c for c in self.children if c.popen.poll() is None]

    def wait_all(self, deadline: float) -> bool:
        """Wait until every child exited or the monotonic deadline passed."""
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(0.05)
        return not self.alive()

    def terminate_all(self, timeout: float = 5.0) -> None:
        for c in self.children:
            kill_tree(c.popen.pid, timeout=timeout)
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.popen.wait(timeout=timeout)
            _STARTED.discard(c.popen.pid)
        kill_leftovers(timeout)  # what the children started and left behind, in sessions of its own

    def __enter__(self) -> ProcessSet:
        return self

    def __exit__(self, *exc) -> None:
        self.terminate_all()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Turn SIGTERM (and SIGHUP) into KeyboardInterrupt in the main thread, so the
    same teardown path runs for Ctrl-C, `kill` and a closed terminal (hctool/supervise/signals.py
    remembers which, and the command ends by it)."""
    from hctool.supervise.signals import as_interrupt

    old = {s: signal.signal(s, as_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def python_cmd(*args: str) -> list[str]:
    return [sys.executable, *args]
