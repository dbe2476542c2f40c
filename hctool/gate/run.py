"""Running one step's command: a subprocess with a deadline whose whole process
tree is reaped, on time-out, failure and Ctrl-C alike."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import psutil

from hctool.console import log
from hctool.supervise.procs import kill_tree


class Proc(NamedTuple):
    code: int | None  # None: killed at the deadline
    stdout: str
    stderr: str
    seconds: float


def become_subreaper() -> None:
    """Orphans of a step (a daemon its command forgot) get re-parented to us, so
    reap_leftovers() can find and end them. Linux only; elsewhere a no-op."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap_leftovers() -> list[str]:
    """End every descendant still running; returns their command lines."""
    left = psutil.Process().children(recursive=True)
    names = []
    for p in left:
        with contextlib.suppress(psutil.Error):
            names.append(" ".join(p.cmdline())[:120])
            p.terminate()
    _, alive = psutil.wait_procs(left, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    return names


def run_command(
    cmd: list[str], cwd: Path, timeout: float, log_dir: Path, name: str, env: dict[str, str] | None = None
) -> Proc:
    """stdout and stderr go to files (no pipe can fill up and stall the child)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / f"{name}.stdout", log_dir / f"{name}.stderr"
    start = time.monotonic()
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop("GITHUB_ACTIONS", None)  # the gate prints the annotations; a step's own would be duplicates
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        popen = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True
        )
    code: int | None = None
    try:
        code = popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log.info(f"hctool gate: {name}: deadline of {timeout:.0f} s passed, ending it")
    finally:
        kill_tree(popen.pid)  # SIGTERM first: an hctool command then reaps its own ranks
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=10)
        with contextlib.suppress(OSError):
            os.killpg(popen.pid, signal.SIGKILL)  # stragglers left in the step's session
    return Proc(
        code, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"), time.monotonic() - start
    )


def tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def python_hctool(*args: str) -> list[str]:
    return [sys.executable, "-m", "hctool", *args]
