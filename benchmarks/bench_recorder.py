"""What the check-consensus recorder adds to a collective (docs/performance.md, "Recorder cost").

Every mode compares processes: "off" runs with no hctool code at all, "on" with the
recorder injected through sitecustomize exactly as `check-consensus run` does (both
capture routes: the torch.distributed wrappers and the c10d dispatcher kernel). Off and
on alternate --repeats times so both see the same machine load; medians are reported.

Arms (--arms, default off,on,py): "on" records through the C hot path
(hctool/agent/capture/_fastpath.c, built at install), "py" through the Python path
(HCTOOL_FASTPATH=0, what a rank gets where the C module was not built).

world1 (default): one process, a gloo world of one, back-to-back 4-byte all_reduce.
  Each process reports wall and CPU (process_time) microseconds per call; the result
  is the median of each and the median of the paired on-off differences.
ranks: N rank processes (gloo on CPU, or nccl with one GPU per rank); rank 0 reports
  the per-call time of back-to-back 4-byte all_reduces (one device sync per run).
  Every "on" run's trace is analyzed: verdict and what rank 0 recorded.
parts: one process with the recorder on; times each piece of the hot path alone
  (the entry record, the completion write, the whole Python wrapper, the dispatcher
  kernel that C++-issued calls pass through) against torch's own call.

    python benchmarks/bench_recorder.py [--iters 20000] [--repeats 7]
    python benchmarks/bench_recorder.py --mode parts
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

ROOT = Path(__file__).resolve().parents[1]


def _time_loop(fn, t, iters: int, sync) -> tuple[float, float]:
    """(wall, CPU) microseconds per call."""
    sync()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(iters):
        fn(t)
    sync()
    return (time.perf_counter() - t0) / iters * 1e6, (time.process_time() - c0) / iters * 1e6


def rank_worker(backend: str, iters: int, out: str, sync_each: bool) -> None:
    import torch
    import torch.distributed as dist

    device = "cpu"
    if backend == "nccl":
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(device)
    if os.environ.get("WORLD_SIZE") == "1":  # no rendezvous port needed
        dist.init_process_group(backend, init_method=f"file://{out}.store", rank=0, world_size=1)
    else:
        dist.init_process_group(backend)
    t = torch.ones(1, device=device)
    sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
    call = dist.all_reduce
    if sync_each:  # the latency of one collective, not the enqueue rate

        def call(x):
            dist.all_reduce(x)
            sync()

    _time_loop(call, t, max(iters // 10, 1), sync)
    dist.barrier()
    wall, cpu = _time_loop(call, t, iters, sync)
    if dist.get_rank() == 0:
        rec = sys.modules.get("hctool.agent.capture.recorder")
        Path(out).write_text(
            json.dumps(
                {
                    "wall": wall,
                    "cpu": cpu,
                    "hctool": "hctool" in sys.modules,
                    "fastpath": rec._S.fastpath if rec else False,
                }
            )
        )
    dist.destroy_process_group()


def ranks(
    backend: str,
    nproc: int,
    iters: int,
    repeats: int,
    sync_each: bool = False,
    arms: tuple[str, ...] = ("off", "on", "py"),
) -> dict:
    sys.path.insert(0, str(ROOT))
    from hctool.consensus import analyze_dir
    from hctool.supervise.procs import ProcessSet, free_port, inject_env, torchrun_env

    runs: dict[str, list] = {k: [] for a in arms for k in (a, a + "_cpu")}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for i in range(repeats):
            for mode in arms:
                env = dict(os.environ)
                if mode != "off":
                    env = inject_env(env, TRACE_DIR=str(tmp / f"trace-{mode}-{i}"))
                    env["HCTOOL_FASTPATH"] = "0" if mode == "py" else "1"
                out, port = tmp / f"{mode}-{i}.json", free_port()
                with ProcessSet() as ps:
                    for r in range(nproc):
                        cmd = [
                            sys.executable,
                            __file__,
                            "--worker",
                            "--backend",
                            backend,
                            "--iters",
                            str(iters),
                            "--out",
                            str(out),
                        ] + (["--sync-each"] if sync_each else [])
                        ps.start(
                            f"rank{r}",
                            cmd,
                            env=dict(env, **torchrun_env(r, nproc, "127.0.0.1", port)),
                            log_path=tmp / f"{mode}-{i}-{r}.log",
                        )
                    if not ps.wait_all(time.monotonic() + 300) or any(c.popen.returncode for c in ps.children):
                        logs = "\n".join(p.read_text()[-1500:] for p in tmp.glob(f"{mode}-{i}-*.log"))
                        raise SystemExit(f"{mode} run failed:\n{logs}")
                res = json.loads(out.read_text())
                if res["hctool"] != (mode != "off") or bool(res["fastpath"]) != (mode == "on"):
                    raise SystemExit(
                        f"the {mode} run recorded wrong: hctool loaded {res['hctool']}, "
                        f"C hot path {res['fastpath']} (is the C module built? pip install -e .)"
                    )
                runs.setdefault("paths", {})[mode] = res["fastpath"]
                runs[mode].append(res["wall"])
                runs[mode + "_cpu"].append(res["cpu"])
                if mode != "off":  # evidence the recorder was on: what it saw
                    report = analyze_dir(tmp / f"trace-{mode}-{i}")
                    runs.setdefault("verdicts", []).append(report["verdict"])
                    runs.setdefault("recorded_rank0", []).append(report["counts"].get("0", {}))
    res = {k: statistics.median(v) for k, v in runs.items() if k in ("off", "on", "py", "off_cpu", "on_cpu", "py_cpu")}
    for arm in arms[1:]:
        res[f"paired_added_{arm}_us"] = statistics.median(b - a for a, b in zip(runs["off"], runs[arm]))
        res[f"paired_added_{arm}_cpu_us"] = statistics.median(
            b - a for a, b in zip(runs["off_cpu"], runs[arm + "_cpu"])
        )
        res[f"ratio_{arm}"] = res[arm] / res["off"]
    return res | {"runs": runs}


def parts(iters: int, repeats: int) -> dict:
    """Each piece of the hot path timed alone, in one process with the recorder on."""
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.distributed as dist

    from hctool.agent.capture import recorder, state, wrappers

    with tempfile.TemporaryDirectory() as d:
        state.S.trace_dir = d
        wrappers.patch_torch_distributed()
        dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
        t = torch.ones(1)
        torch_call = dist.all_reduce.__hctool_original__
        guard = wrappers._new_guard(-1)

        def below(x):  # torch's own call, the dispatcher kernel skipped as the wrapper does
            with guard:
                torch_call(x)

        def entry(x):
            recorder.record_collective("all_reduce", None, x, frame=sys._getframe(1))

        def entry_complete(x):
            recorder.record_complete(recorder.record_collective("all_reduce", None, x, frame=sys._getframe(1)))

        cases = {
            "torch call, below autograd": below,
            "wrapped dist.all_reduce": dist.all_reduce,
            "torch call through the dispatcher kernel (how C++-issued calls are seen)": torch_call,
            "entry record alone": entry,
            "entry + completion alone": entry_complete,
        }
        runs: dict[str, list[float]] = {k: [] for k in cases}
        for fn in cases.values():
            _time_loop(fn, t, max(iters // 10, 1), lambda: None)
        for _ in range(repeats):
            for name, fn in cases.items():
                runs[name].append(_time_loop(fn, t, iters, lambda: None)[1])
        dist.destroy_process_group()
    return {k: statistics.median(v) for k, v in runs.items()} | {"runs": runs, "unit": "CPU us per call"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("world1", "ranks", "parts"), default="world1")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--sync-each", action="store_true", help="ranks mode: synchronize after every call")
    ap.add_argument("--arms", default="off,on,py", help="which of off,on,py to run (off first)")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.worker:
        rank_worker(args.backend, args.iters, args.out, args.sync_each)
        return
    load = os.getloadavg()[0]
    if args.mode == "parts":
        res = parts(args.iters, args.repeats) | {"load_avg": load}
        if args.json:
            print(json.dumps(res))
            return
        print(
            f"recorder on, gloo world of 1, median of {args.repeats} x {args.iters} calls, CPU "
            f"us/call (load {load:.1f}):"
        )
        for k, v in res.items():
            if isinstance(v, float) and k != "load_avg":
                print(f"  {v:7.2f}  {k}")
        return
    nproc = 1 if args.mode == "world1" else args.nproc
    arms = tuple(a for a in args.arms.split(",") if a)
    if arms[:1] != ("off",) or not set(arms) <= {"off", "on", "py"} or len(arms) < 2:
        raise SystemExit("--arms: off first, then on and/or py")
    res = ranks(args.backend, nproc, args.iters, args.repeats, args.sync_each, arms)
    what = f"{nproc} rank{'s' if nproc > 1 else ''}, {args.backend}, 4-byte all_reduce" + (
        ", sync after each" if args.sync_each else ""
    )
    res.update(what=what, iters=args.iters, repeats=args.repeats, load_avg=load)
    if args.json:
        print(json.dumps(res))
        return
    print(f"{what}: median of {args.repeats} alternating launches per arm x {args.iters} calls (load {load:.1f})")
    print(f"off: wall {res['off']:.2f} | CPU {res['off_cpu']:.2f} us/call")
    for arm in arms[1:]:
        name = {"on": "on (C hot path)", "py": "on (Python path)"}[arm]
        print(
            f"{name}: wall {res[arm]:.2f} (paired +{res[f'paired_added_{arm}_us']:.2f}, ratio "
            f"{res[f'ratio_{arm}']:.3f}) | CPU {res[arm + '_cpu']:.2f} (paired "
            f"+{res[f'paired_added_{arm}_cpu_us']:.2f}) us/call"
        )
    print(
        f"recorded runs: verdicts {sorted(set(res['runs']['verdicts']))}, rank 0 recorded "
        f"{res['runs']['recorded_rank0'][0]}"
    )


if __name__ == "__main__":
    main()
