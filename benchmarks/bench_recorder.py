"""Overhead of the check-consensus recorder on gloo all_reduce, 2 ranks, CPU.

Modes, all in one run on the same machine: off (no probes), hctool (recorder
injected through sitecustomize), detail (TORCH_DISTRIBUTED_DEBUG=DETAIL).
Sizes: 4 bytes and 1 MiB. Each rank does `--repeats` timed runs of `--iters`
calls after a warm-up; the figure is the median over runs of the per-run mean
microseconds per call, as seen by rank 0.

    python benchmarks/bench_recorder.py [--iters 300] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hctool.procs import ProcessSet, free_port, inject_env, torchrun_env  # noqa: E402

SIZES = {"4 B": 1, "1 MiB": 262144}  # float32 elements


def worker(iters: int, repeats: int, out: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    result = {}
    for label, n in SIZES.items():
        t = torch.ones(n)
        for _ in range(20):
            dist.all_reduce(t)
        runs = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            runs.append((time.perf_counter() - t0) / iters * 1e6)
        result[label] = statistics.median(runs)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def run_mode(mode: str, iters: int, repeats: int, tmp: Path) -> dict:
    env = dict(os.environ)
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)
    if mode == "hctool":
        env = inject_env(env, TRACE_DIR=str(tmp / "trace"))
    elif mode == "detail":
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    out = tmp / f"{mode}.json"
    port = free_port()
    with ProcessSet() as ps:
        for r in range(2):
            ps.start(f"rank{r}", [sys.executable, __file__, "--worker", "--iters", str(iters), "--repeats",
                                  str(repeats), "--out", str(out)],
                     env=dict(env, **torchrun_env(r, 2, "127.0.0.1", port)), log_path=tmp / f"{mode}-{r}.log")
        if not ps.wait_all(time.monotonic() + 600) or any(c.popen.returncode for c in ps.children):
            raise SystemExit(f"{mode} failed; see {tmp}")
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.worker:
        worker(args.iters, args.repeats, args.out)
        return
    with tempfile.TemporaryDirectory() as d:
        results = {m: run_mode(m, args.iters, args.repeats, Path(d)) for m in ("off", "hctool", "detail")}
    print(f"{'size':>6} | {'off us':>8} | {'hctool us':>9} | {'ratio':>5} | {'DETAIL us':>9} | {'ratio':>5}")
    for label in SIZES:
        off, hc, de = (results[m][label] for m in ("off", "hctool", "detail"))
        print(f"{label:>6} | {off:8.1f} | {hc:9.1f} | {hc / off:5.2f} | {de:9.1f} | {de / off:5.2f}")


if __name__ == "__main__":
    main()
