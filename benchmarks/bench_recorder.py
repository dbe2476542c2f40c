"""CAVEAT: the inproc mode's "off" still goes through the dispatcher-level capture
(hctool/consensus/capture_c10d.py) once the recorder is installed; use --mode ranks for an
honest off/on comparison (docs/performance.md, "Recorder cost").

What the check-consensus recorder adds to a collective.

inproc (default): one process, a gloo world of one, 4-byte all_reduce; the
  recorder is installed once and each repeat times the unwrapped function
  (off) then the wrapped one (on), alternating so both see the same machine
  load. Prints the median per-call microseconds of each and their difference.
ranks: N rank processes (gloo on CPU, or nccl with one GPU per rank), started
  once with no recorder (off) and once with it injected through sitecustomize
  exactly as `check-consensus run` does (on), alternating --repeats times;
  rank 0 reports the median per-call time of back-to-back 4-byte all_reduces
  (one device sync per run). Prints the off/on ratio.

    python benchmarks/bench_recorder.py [--iters 20000] [--repeats 7]
    python benchmarks/bench_recorder.py --mode ranks --backend nccl --nproc 2 [--sync-each]
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


def _time_loop(fn, t, iters: int, sync, clock=time.perf_counter) -> float:
    sync()
    t0 = clock()
    for _ in range(iters):
        fn(t)
    sync()
    return (clock() - t0) / iters * 1e6


def inproc(iters: int, repeats: int) -> dict:
    import torch
    import torch.distributed as dist

    from hctool.consensus import recorder, wrappers

    with tempfile.TemporaryDirectory() as d:
        recorder._S.trace_dir = d
        wrappers.patch_torch_distributed()
        dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
        t = torch.ones(1)
        on, off = dist.all_reduce, dist.all_reduce.__hctool_original__
        runs: dict[str, list[float]] = {"off": [], "on": [], "off_cpu": [], "on_cpu": []}
        for fn in (off, on):
            _time_loop(fn, t, iters // 10, lambda: None)  # warm-up; interns the call site
        for _ in range(repeats):
            for name, fn in (("off", off), ("on", on)):
                runs[name].append(_time_loop(fn, t, iters, lambda: None))
                # CPU time of this process: what a loaded machine distorts least
                runs[name + "_cpu"].append(_time_loop(fn, t, iters, lambda: None, time.process_time))
        dist.destroy_process_group()
    res = {k: statistics.median(v) for k, v in runs.items()} | {"runs": runs}
    res["added_cpu_us"] = res["on_cpu"] - res["off_cpu"]
    return res


def rank_worker(backend: str, iters: int, out: str, sync_each: bool) -> None:
    import torch
    import torch.distributed as dist

    device = "cpu"
    if backend == "nccl":
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    t = torch.ones(1, device=device)
    sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
    call = dist.all_reduce
    if sync_each:  # the latency of one collective, not the enqueue rate
        def call(x):
            dist.all_reduce(x)
            sync()
    _time_loop(call, t, iters // 10, sync)
    dist.barrier()
    us = _time_loop(call, t, iters, sync)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(us))
    dist.destroy_process_group()


def ranks(backend: str, nproc: int, iters: int, repeats: int, sync_each: bool = False) -> dict:
    runs: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for i in range(repeats):
            for mode in ("off", "on"):
                env = dict(os.environ)
                if mode == "on":
                    env = inject_env(env, TRACE_DIR=str(tmp / f"trace-{i}"))
                out, port = tmp / f"{mode}-{i}.json", free_port()
                with ProcessSet() as ps:
                    for r in range(nproc):
                        cmd = [sys.executable, __file__, "--worker", "--backend", backend, "--iters", str(iters),
                               "--out", str(out)] + (["--sync-each"] if sync_each else [])
                        ps.start(f"rank{r}", cmd, env=dict(env, **torchrun_env(r, nproc, "127.0.0.1", port)),
                                 log_path=tmp / f"{mode}-{i}-{r}.log")
                    if not ps.wait_all(time.monotonic() + 300) or any(c.popen.returncode for c in ps.children):
                        logs = "\n".join(p.read_text()[-1500:] for p in tmp.glob(f"{mode}-{i}-*.log"))
                        raise SystemExit(f"{mode} run failed:\n{logs}")
                runs[mode].append(json.loads(out.read_text()))
                if mode == "on":  # evidence the recorder was on: what it saw
                    from hctool.consensus import analyze_dir

                    report = analyze_dir(tmp / f"trace-{i}")
                    runs.setdefault("verdicts", []).append(report["verdict"])
                    runs.setdefault("recorded_rank0", []).append(report["counts"].get("0", {}))
    return {k: statistics.median(v) for k, v in runs.items() if k in ("off", "on")} | {"runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("inproc", "ranks"), default="inproc")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--sync-each", action="store_true", help="ranks mode: synchronize after every call")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.worker:
        rank_worker(args.backend, args.iters, args.out, args.sync_each)
        return
    if args.mode == "inproc":
        res = inproc(args.iters, args.repeats)
        what = "in-process, gloo world of 1, 4-byte all_reduce"
    else:
        res = ranks(args.backend, args.nproc, args.iters, args.repeats, args.sync_each)
        what = f"{args.nproc} ranks, {args.backend}, 4-byte all_reduce" + (", sync after each" if args.sync_each else "")
    res.update(added_us=res["on"] - res["off"], ratio=res["on"] / res["off"], what=what,
               iters=args.iters, repeats=args.repeats)
    if args.json:
        print(json.dumps(res))
        return
    print(f"{what}: median of {args.repeats} runs x {args.iters} calls")
    print(f"off {res['off']:.2f} us/call | on {res['on']:.2f} us/call | added {res['added_us']:.2f} us | "
          f"ratio {res['ratio']:.3f}")
    if "added_cpu_us" in res:
        print(f"process CPU time: off {res['off_cpu']:.2f} us/call | on {res['on_cpu']:.2f} us/call | "
              f"added {res['added_cpu_us']:.2f} us")


if __name__ == "__main__":
    main()
