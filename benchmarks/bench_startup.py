"""Startup time of `hctool launch --tp 2` to its `ready:` line (median over runs).

    python benchmarks/bench_startup.py [--runs 5] [--tp 2] [-- ENGINE FLAGS...]

Each run starts the CLI as a user would, times spawn -> `ready: URL` on stdout,
then stops it with SIGINT and waits for a clean exit before the next run.
"""

from __future__ import annotations

import argparse
import os
import platform
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine() -> str:
    cpu = platform.processor() or "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return (
        f"{platform.node()}: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}, {platform.system()} {platform.release()}"
    )


def one_run(cmd: list[str], env: dict[str, str], deadline_s: float) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=deadline_s):
            raise RuntimeError(f"no ready line within {deadline_s} s")
        line = proc.stdout.readline()
        elapsed = time.perf_counter() - start
        if not line.startswith("ready: "):
            raise RuntimeError(f"launch failed (exit {proc.poll()}): {line!r}")
        return elapsed
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds allowed per startup")
    parser.add_argument("engine_flags", nargs="*", help="engine flags after --")
    args = parser.parse_args()
    flags = args.engine_flags or ["--max-total-tokens", "8192", "--page-size", "16"]

    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "hctool",
            "launch",
            "--tp",
            str(args.tp),
            "--cpu",
            "--port",
            "0",
            "--run-dir",
            tmp,
            *flags,
        ]
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        }
        print(f"machine: {machine()}")
        print(f"command: {' '.join(cmd)}")
        times = []
        for i in range(args.runs):
            times.append(one_run(cmd, env, args.deadline))
            print(f"run {i + 1}: {times[-1]:.2f} s", file=sys.stderr)
    print(
        f"startup to ready, {args.runs} runs: median {statistics.median(times):.2f} s "
        f"(min {min(times):.2f} s, max {max(times):.2f} s)"
    )


if __name__ == "__main__":
    main()
