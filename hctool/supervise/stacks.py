"""Stacks of rank processes, labelled by rank: py-spy first, faulthandler when
ptrace is denied (the recorder registers SIGUSR1 to dump every thread into
rank{R}-{pid}.stack in the trace folder)."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psutil


def _py_spy() -> str | None:
    exe = shutil.which("py-spy")
    if exe is None:
        cand = os.path.join(os.path.dirname(sys.executable), "py-spy")
        exe = cand if os.path.exists(cand) else None
    return exe


def _faulthandler_dump(pid: int, timeout: float, trace_dir: str | None) -> str | None:
    if not trace_dir:
        return None
    files = glob.glob(os.path.join(trace_dir, f"rank*-{pid}.stack"))
    if not files:
        return None
    path = files[0]
    before = os.path.getsize(path)
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError:
        return None
    deadline = time.monotonic() + min(timeout, 2.0)
    size = before
    while time.monotonic() < deadline:
        time.sleep(0.05)
        new_size = os.path.getsize(path)
        if new_size > before and new_size == size:  # grew, then stopped growing
            break
        size = new_size
    with open(path, "rb") as f:
        f.seek(before)
        text = f.read().decode(errors="replace")
    return f"(faulthandler)\n{text}" if text else None


def _bare_threads(text: str) -> list[str]:
    """Thread headers py-spy printed with no frame under them."""
    lines = text.splitlines()
    return [
        ln.strip()
        for i, ln in enumerate(lines)
        if ln.startswith("Thread ") and (i + 1 == len(lines) or not lines[i + 1].startswith(" "))
    ]


def dump_one(pid: int, timeout: float = 10.0, trace_dir: str | None = None, tries: int = 3) -> str:
    """One process's stacks. py-spy reads the interpreter's memory while it runs: a read that
    lands mid-update shows a thread with no frame (or fails), so a dump whose main thread came
    back bare is taken again, up to `tries` times; what still has no frame is said so."""
    exe = _py_spy()
    err = "py-spy not found"
    best = None
    deadline = time.monotonic() + timeout
    for attempt in range(tries if exe is not None else 0):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            out = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            err = f"py-spy timed out after {timeout:.0f} s"
            break
        if out.returncode == 0 and out.stdout.strip():
            if best is None or len(_bare_threads(out.stdout)) < len(_bare_threads(best)):
                best = out.stdout
            if not any('"MainThread"' in t for t in _bare_threads(best)):
                break
        else:
            err = ((out.stderr or out.stdout).strip().splitlines()[-1:] or ["py-spy failed"])[0]
            if not psutil.pid_exists(pid):
                err = "the process ended before its stack could be read"
                break
        time.sleep(0.05 * (attempt + 1))
    if best is not None:
        bare = [t for t in _bare_threads(best) if '"MainThread"' in t]
        if bare:
            best = best.rstrip() + (
                "\n(py-spy saw no Python frame on the main thread in 3 reads: it was "
                "outside Python code, e.g. in interpreter teardown or a C++ call made "
                "without a Python caller)\n"
            )
        return best
    fallback = _faulthandler_dump(pid, timeout, trace_dir)
    return fallback if fallback else f"(no stack: {err})"


def dump_stacks(
    pids_by_rank: dict[int, int | list[int]], timeout: float = 10.0, trace_dir: str | None = None
) -> dict[str, str]:
    """{"<rank>": text}: every process of every rank dumped in parallel; a rank
    with several processes gets one labelled section per pid. Paths as hctool.console.paths
    shows them (relative to the working directory, the interpreter by its name)."""
    from hctool.console.paths import tidy_stack_text

    jobs = [(r, p) for r, pids in sorted(pids_by_rank.items()) for p in (pids if isinstance(pids, list) else [pids])]
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(jobs)))) as pool:
        texts = list(pool.map(lambda j: dump_one(j[1], timeout, trace_dir), jobs))
    # every report shows these texts (text, JSON, HTML, the run record): no machine paths in them
    texts = [tidy_stack_text(t) for t in texts]
    out: dict[str, list[str]] = {}
    for (rank, pid), text in zip(jobs, texts):
        out.setdefault(str(rank), []).append(f"rank {rank} (pid {pid})\n{text.rstrip()}")
    return {r: "\n\n".join(parts) for r, parts in out.items()}


def rank_of_pid(pid: int) -> int | None:
    """RANK from the process's environment at exec time (torchrun sets it per worker)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"RANK="):
                    return int(item[5:])
    except (OSError, ValueError):
        return None
    return None


def ranks_in_tree(root_pid: int) -> dict[int, list[int]]:
    """{rank: [pids]} for the processes under root_pid (root included) that carry
    RANK and run Python; a worker's own helper children with the same RANK are kept out."""
    try:
        root = psutil.Process(root_pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    found: dict[int, list[int]] = {}
    for p in procs:
        rank = rank_of_pid(p.pid)
        if rank is None:
            continue
        try:
            parent_rank = rank_of_pid(p.ppid())
        except psutil.NoSuchProcess:
            continue
        if parent_rank == rank and p.pid != root_pid:
            continue
        found.setdefault(rank, []).append(p.pid)
    return found
