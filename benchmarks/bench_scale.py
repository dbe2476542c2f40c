"""A thousand ranks: hctool and PyTorch's Flight Recorder analyzer on the same dumps.

Makes Flight Recorder dumps of N ranks x E entries with the schema and field values of a dump
torch writes (every key of a real entry, pickled as torch pickles it), as an NCCL job leaves
them (gloo's dumps hold no p2p and no group members, so NCCL's form is the one to scale):

- a default group, tensor-parallel groups of 8 ranks, pipeline pairs (r, r^1);
- per step: a gradient all_reduce on the default group (train.py:40), a TP all_reduce
  (model.py:120), a batched p2p exchange with the pipeline peer (a coalesced send+recv, as
  batch_isend_irecv leaves it), and every 4th step a coalesced pair of all_gathers;
- ring buffers that start at different points (each rank has run a few more steps before the
  E entries its buffer holds), the stuck call of every rank left "scheduled";
- one fault at rank K (default N/2) in step S: `extra` (one more gradient all_reduce, from
  train.py:77), `missing` (that step's gradient all_reduce skipped), `shape` (1000 elements where
  the others have 1024) or `nodump` (rank K left no dump).

Then runs `hctool check-consensus analyze DIR --json` and `python -m torch.distributed.
flight_recorder.fr_trace DIR` on them, each in its own process, and prints seconds, peak memory
(RSS of the process and its workers) and what each named, one JSON line per tool and fault.

    python benchmarks/bench_scale.py --ranks 1024 --entries 2000 [--faults extra,missing,shape,nodump] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the keys and value types of an entry torch 2.13 writes (a real dump, tests/consensus/programs/fr_tutorial.py)
TEMPLATE = {
    "collective_seq_id": 1,
    "frames": [],
    "input_dtypes": ["Float"],
    "input_sizes": [[4]],
    "is_p2p": False,
    "op_id": 1,
    "output_dtypes": ["Float"],
    "output_sizes": [[4]],
    "p2p_seq_id": 0,
    "pg_id": 0,
    "process_group": ("0", "default_pg"),
    "profiling_name": "nccl:all_reduce",
    "record_id": 0,
    "retired": True,
    "state": "completed",
    "thread_id": "140207913626496",
    "thread_name": "pt_main_thread",
    "time_created_ns": 0,
    "time_discovered_completed_ns": None,
    "time_discovered_started_ns": None,
    "timeout_ms": 600000,
}
TORCH = "/opt/conda/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def frames(user: list[tuple[str, int, str]]) -> list[dict]:
    return [
        {"filename": TORCH, "line": 2696, "name": "all_reduce"},
        {"filename": TORCH.replace("distributed_c10d", "c10d_logger"), "line": 83, "name": "wrapper"},
    ] + [{"filename": f"/workspace/{f}", "line": line, "name": fn} for f, line, fn in user]


GRAD = frames([("train.py", 40, "step"), ("train.py", 99, "main")])
EXTRA = frames([("train.py", 77, "log_grad_norm"), ("train.py", 41, "step"), ("train.py", 99, "main")])
TP = frames([("model.py", 120, "forward"), ("train.py", 38, "step"), ("train.py", 99, "main")])
GATHER = frames([("train.py", 55, "gather_stats"), ("train.py", 42, "step"), ("train.py", 99, "main")])
P2P = frames([("pipeline.py", 30, "exchange"), ("train.py", 36, "step"), ("train.py", 99, "main")])


def rank_entries(rank: int, world: int, steps: int, fault: str | None, k: int, s: int) -> list[dict]:
    tp_pg, pp_pg = 1 + rank // 8, 1 + world // 8 + rank // 2
    peer_local = 1 - (rank % 2) if rank ^ 1 < world else 0
    me_local = rank % 2
    cseq = {0: 0, tp_pg: 0, pp_pg: 0}
    pseq = {pp_pg: 0}
    out: list[dict] = []
    t = 1_700_000_000_000_000_000 + rank * 1000

    def add(pg: int, desc: str, name: str, sizes, fr, p2p=False, same_seq=False):
        nonlocal t
        e = dict(TEMPLATE)
        if p2p:
            if not same_seq:
                pseq[pg] += 1
            e.update(p2p_seq_id=pseq[pg], collective_seq_id=cseq[pg], is_p2p=True)
        else:
            if not same_seq:
                cseq[pg] += 1
            e.update(collective_seq_id=cseq[pg], p2p_seq_id=0)
        t += 1000
        e.update(
            pg_id=pg,
            process_group=(str(pg), desc),
            profiling_name=f"nccl:{name}",
            input_sizes=sizes,
            output_sizes=sizes,
            frames=fr,
            time_created_ns=t,
            op_id=len(out) + 1,
        )
        out.append(e)

    for step in range(steps):
        add(tp_pg, "tp", "all_reduce", [[256]], TP)
        if world > 1 and rank ^ 1 < world:
            add(pp_pg, "pp", f"send {me_local}->{peer_local}", [[64]], P2P, p2p=True)
            add(pp_pg, "pp", f"recv {me_local}<-{peer_local}", [[64]], P2P, p2p=True, same_seq=True)
            add(pp_pg, "pp", "coalesced", [], P2P, p2p=True, same_seq=True)
        here = rank == k and step == s
        if not (here and fault == "missing"):
            add(0, "default_pg", "all_reduce", [[1000 if here and fault == "shape" else 1024]], GRAD)
        if here and fault == "extra":
            add(0, "default_pg", "all_reduce", [[1024]], EXTRA)
        if step % 4 == 3:
            add(0, "default_pg", "all_gather", [[32]], GATHER)
            add(0, "default_pg", "all_gather", [[32]], GATHER, same_seq=True)
            add(0, "default_pg", "coalesced", [], GATHER, same_seq=True)
    return out


def make(folder: Path, world: int, entries: int, fault: str | None, k: int) -> int:
    """Dumps of every rank; returns the step of the fault."""
    per_step = 5 + 3 / 4 * 1 + 0.75  # calls per step, about
    steps = int(entries / per_step) + 12
    s = steps - max(20, int(0.3 * entries / per_step))  # the fault inside every buffer
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(world)))}}
    for g in range(1 + (world - 1) // 8):
        config[str(1 + g)] = {
            "name": str(1 + g),
            "desc": "tp",
            "ranks": json.dumps(list(range(8 * g, min(world, 8 * g + 8)))),
        }
    for p in range(world // 2):
        config[str(1 + (world - 1) // 8 + 1 + p)] = {
            "name": str(1 + (world - 1) // 8 + 1 + p),
            "desc": "pp",
            "ranks": json.dumps([2 * p, 2 * p + 1]),
        }
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        if fault == "nodump" and r == k:
            continue
        es = rank_entries(r, world, steps, None if fault == "nodump" else fault, k, s)
        # the job hangs at its last call: every rank's last entry is still scheduled
        es[-1] = dict(es[-1], state="scheduled", retired=False)
        es = es[-(entries - 7 * (r % 3)) :]  # ring buffers that start at different points
        for i, e in enumerate(es):
            e["record_id"] = i
        dump = {"version": "2.10", "pg_config": config, "pg_status": {}, "comm_lib_version": "2.28.9", "entries": es}
        with open(folder / f"rank_{r}", "wb") as f:
            pickle.dump(dump, f)
    return s


# runs a command and prints, last on stderr, the peak RSS of it and its workers (KiB)
MEASURE = (
    "import resource, subprocess, sys\n"
    "p = subprocess.run(sys.argv[1:])\n"
    "print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(p.returncode)\n"
)


def run_tool(cmd: list[str], timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True, timeout=timeout)
        out, err, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired:
        out, err, code = "", f"timed out after {timeout:.0f} s", None
    secs = time.perf_counter() - t0
    peak = 0
    for line in err.splitlines():
        if line.startswith("PEAK_KB "):
            peak = int(line.split()[1])
    err = "\n".join(ln for ln in err.splitlines() if not ln.startswith("PEAK_KB "))
    return {"seconds": round(secs, 2), "peak_rss_mb": round(peak / 1024), "exit": code, "out": out, "err": err}


def hctool_answer(res: dict) -> str:
    try:
        rep = json.loads(res["out"])
    except ValueError:
        return "no answer: " + (res["err"].strip().splitlines() or ["?"])[-1][:200]
    fd = rep.get("first_divergence")
    if not fd:
        return f"{rep['verdict']}: {rep.get('reason')}"
    return (
        f"{rep['verdict']}: culprit {fd['culprit_ranks'][:8]} {fd['kind']} at "
        f"{(fd.get('cause') or {}).get('site')} (group {fd['group']})"
    )


def torch_answer(res: dict) -> str:
    text = (res["out"] + "\n" + res["err"]).strip().splitlines()
    keep = [
        ln
        for ln in text
        if any(
            w in ln
            for w in (
                "Not all ranks",
                "missing ranks",
                "Culprit",
                "mismatch",
                "collective:",
                "Error",
                "error",
                "Traceback",
            )
        )
    ]
    return " | ".join(keep[:4])[:300] or (" | ".join(text[-3:])[:300] if text else "(no output)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--faults", default="extra,missing,shape,nodump")
    ap.add_argument("--rank", type=int, default=None, help="the faulty rank (default: ranks/2)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--skip-torch", action="store_true")
    args = ap.parse_args()
    k = args.rank if args.rank is not None else args.ranks // 2
    for fault in args.faults.split(","):
        with tempfile.TemporaryDirectory(prefix="hctool-bench-scale-") as tmp:
            folder = Path(tmp) / "dumps"
            t0 = time.perf_counter()
            step = make(folder, args.ranks, args.entries, fault, k)
            size = sum(p.stat().st_size for p in folder.iterdir())
            print(
                f"{fault}: {args.ranks} dumps x {args.entries} entries ({size >> 20} MiB) made in "
                f"{time.perf_counter() - t0:.1f} s; fault at rank {k}, step {step}",
                file=sys.stderr,
            )
            tools = [
                (
                    "hctool",
                    [sys.executable, "-m", "hctool", "check-consensus", "analyze", "--json", str(folder)],
                    hctool_answer,
                )
            ]
            if not args.skip_torch:
                tools.append(
                    (
                        "torch fr_trace",
                        [
                            sys.executable,
                            "-m",
                            "torch.distributed.flight_recorder.fr_trace",
                            str(folder),
                            "--prefix",
                            "rank_",
                            "--allow-incomplete-ranks",
                        ],
                        torch_answer,
                    )
                )
            for name, cmd, answer in tools:
                res = [run_tool(cmd, args.timeout) for _ in range(args.runs)]
                print(
                    json.dumps(
                        {
                            "tool": name,
                            "fault": fault,
                            "ranks": args.ranks,
                            "entries": args.entries,
                            "runs": args.runs,
                            "median_s": statistics.median(r["seconds"] for r in res),
                            "peak_rss_mb": max(r["peak_rss_mb"] for r in res),
                            "answer": answer(res[-1]),
                        }
                    ),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
