"""Training step time with and without the check-consensus recorder, on
pytorch/examples programs (docs/performance.md, "Recorder cost on H200").

  off: python -m torch.distributed.run --standalone --nproc-per-node 2 PROG ARGS
  on:  python -m hctool check-consensus run --json -- <the same command>

Each is run at two lengths (--short and --long epochs for DDP, steps for
FSDP2) in a fresh working folder; the time per epoch/step is
(wall(long) - wall(short)) / (long - short), which cancels start-up (imports,
NCCL init, hctool's own start and analysis) and shows only what the recorder
adds per training step. Off and on alternate --repeats times; medians are
reported. "on" runs must be `consistent`; their counts are kept as evidence.

  ddp:   ddp-tutorial-series/multigpu_torchrun.py SAVE_EVERY EPOCHS (32 steps an epoch)
  fsdp2: FSDP2/example.py, run from a copy whose `for _ in range(10):` training
         loop reads its length from HCTOOL_BENCH_STEPS (the only change)

    python benchmarks/bench_step_time.py --examples DIR/distributed --case ddp --short 5 --long 105
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def program(examples: Path, case: str, work: Path) -> tuple[Path, list[str], str]:
    """(folder, argv template with {n}, env var for n or '')."""
    if case == "ddp":
        src = examples / "ddp-tutorial-series"
        return src, [str(src / "multigpu_torchrun.py"), "100000", "{n}"], ""
    src, dst = examples / "FSDP2", work / "fsdp2"
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.glob("*.py"):
        text = f.read_text()
        if f.name == "example.py":
            if "    for _ in range(10):\n" not in text:
                raise SystemExit("FSDP2/example.py has no `for _ in range(10):` loop to lengthen")
            text = text.replace("    for _ in range(10):\n",
                                "    for _ in range(int(__import__('os').environ['HCTOOL_BENCH_STEPS'])):\n", 1)
        (dst / f.name).write_text(text)
    return dst, [str(dst / "example.py")], "HCTOOL_BENCH_STEPS"


def run_once(mode: str, folder: Path, argv: list[str], n_var: str, n: int, work: Path, timeout: float) -> dict:
    cwd = Path(tempfile.mkdtemp(dir=work, prefix=f"{mode}-{n}-"))  # FSDP2 resumes from ./checkpoints
    env = dict(os.environ, PYTHONPATH=f"{folder}:{REPO}:{os.environ.get('PYTHONPATH', '')}")
    env.pop("HCTOOL_TRACE_DIR", None)
    args = [a.format(n=n) for a in argv]
    if n_var:
        env[n_var] = str(n)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    if mode == "on":
        cmd = [sys.executable, "-m", "hctool", "check-consensus", "run", "--json", "--timeout", str(timeout - 10),
               "--trace-dir", str(cwd / "trace"), "--", *cmd]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, text=True, errors="replace")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = "", "timed out"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # stray ranks, also on success
        except ProcessLookupError:
            pass
        proc.wait()
    wall = time.monotonic() - t0
    res = {"mode": mode, "n": n, "wall_s": round(wall, 3), "exit": proc.returncode}
    if mode == "on":
        try:
            report = json.loads(out)
            res.update(verdict=report["verdict"], counts=report.get("counts", {}).get("0"))
        except ValueError:
            res["verdict"] = None
    if proc.returncode != 0:
        res["err"] = err[-800:]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=Path, required=True, help="pytorch/examples distributed/ folder")
    ap.add_argument("--case", choices=("ddp", "fsdp2"), default="ddp")
    ap.add_argument("--short", type=int, default=5)
    ap.add_argument("--long", type=int, default=105)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.long <= args.short:
        ap.error("--long must be larger than --short")
    work = Path(tempfile.mkdtemp(prefix="hctool-steptime-"))
    folder, argv, n_var = program(args.examples, args.case, work)
    runs, per_unit = [], {"off": [], "on": []}
    for _ in range(args.repeats):
        for mode in ("off", "on"):
            pair = [run_once(mode, folder, argv, n_var, n, work, args.timeout) for n in (args.short, args.long)]
            runs += pair
            print(json.dumps(pair), file=sys.stderr, flush=True)
            if any(r["exit"] != 0 for r in pair):
                raise SystemExit(f"{mode} run failed: {pair}")
            per_unit[mode].append((pair[1]["wall_s"] - pair[0]["wall_s"]) / (args.long - args.short) * 1e3)
    off, on = statistics.median(per_unit["off"]), statistics.median(per_unit["on"])
    unit = "epoch (32 steps)" if args.case == "ddp" else "step"
    res = {"case": args.case, "unit": unit, "off_ms": off, "on_ms": on, "ratio": on / off, "per_unit_ms": per_unit,
           "short": args.short, "long": args.long, "repeats": args.repeats, "runs": runs}
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
