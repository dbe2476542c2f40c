"""Training step time with and without the check-consensus recorder, on
pytorch/examples programs (docs/performance.md, "Recorder cost on H200").

  off: python -m torch.distributed.run --standalone --nproc-per-node 2 PROG ARGS
  on:  python -m hctool check-consensus run --json -- <the same command>

The time per epoch (DDP, 32 steps each) or step (FSDP2) comes from the
program's own output: each runs from a copy (made at run time, never stored in
the repo) changed only to time its training loop after a warm-up, between two
torch.cuda.synchronize() calls, and print `HCTOOL_BENCH_MS <ms per unit>`; the
slower rank's figure counts. So start-up (imports, NCCL init, hctool's own start
and analysis) is excluded. Off and on alternate --repeats times; medians are
reported. "on" runs must be `consistent`; their counts are kept as evidence.

  ddp:   ddp-tutorial-series/multigpu_torchrun.py EPOCHS 100000 (2 warm-up epochs first)
  fsdp2: FSDP2/example.py, its `for _ in range(10):` loop run 3 + N times

    python benchmarks/bench_step_time.py --examples DIR/distributed --case ddp --n 30
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


PATCHES = {
    "ddp": (
        "ddp-tutorial-series",
        "multigpu_torchrun.py",
        "    trainer.train(total_epochs)\n",
        "    import time as _t\n"
        "    trainer.train(2)  # warm-up\n"
        "    torch.cuda.synchronize(); _t0 = _t.perf_counter()\n"
        "    trainer.train(total_epochs)\n"
        "    torch.cuda.synchronize()\n"
        "    print(f'HCTOOL_BENCH_MS {(_t.perf_counter() - _t0) / total_epochs * 1e3:.4f}', flush=True)\n",
    ),
    "fsdp2": (
        "FSDP2",
        "example.py",
        "    for _ in range(10):\n",
        "    import time as _t\n"
        "    _n = int(os.environ['HCTOOL_BENCH_STEPS'])\n"
        "    for _i in range(3 + _n):\n"
        "        if _i == 3:  # after warm-up\n"
        "            torch.cuda.synchronize(); _t0 = _t.perf_counter()\n",
    ),
}
FSDP2_END = (
    "    checkpointer.save(model, optim)\n",
    "    torch.cuda.synchronize()\n"
    "    print(f'HCTOOL_BENCH_MS {(_t.perf_counter() - _t0) / _n * 1e3:.4f}', flush=True)\n"
    "    checkpointer.save(model, optim)\n",
)


def program(examples: Path, case: str, work: Path) -> tuple[Path, list[str]]:
    """A timed copy of the example: (its folder, argv template with {n})."""
    sub, main, old, new = PATCHES[case]
    src, dst = examples.resolve() / sub, work / case
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.glob("*.py"):
        text = f.read_text()
        if f.name == main:
            for a, b in [(old, new)] + ([FSDP2_END] if case == "fsdp2" else []):
                if a not in text:
                    raise SystemExit(f"{sub}/{main} changed: no {a.strip()!r} to time")
                text = text.replace(a, b, 1)
            if "import os" not in text:
                text = "import os\n" + text
        (dst / f.name).write_text(text)
    return dst, ([str(dst / main), "{n}", "100000"] if case == "ddp" else [str(dst / main)])


def run_once(mode: str, folder: Path, argv: list[str], n: int, work: Path, timeout: float) -> dict:
    cwd = Path(tempfile.mkdtemp(dir=work, prefix=f"{mode}-{n}-"))  # FSDP2 resumes from ./checkpoints
    env = dict(os.environ, PYTHONPATH=f"{folder}:{REPO}:{os.environ.get('PYTHONPATH', '')}")
    env.pop("HCTOOL_TRACE_DIR", None)
    args = [a.format(n=n) for a in argv]
    env["HCTOOL_BENCH_STEPS"] = str(n)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    if mode == "on":
        cmd = [
            sys.executable,
            "-m",
            "hctool",
            "check-consensus",
            "run",
            "--json",
            "--timeout",
            str(timeout - 10),
            "--trace-dir",
            str(cwd / "trace"),
            "--",
            *cmd,
        ]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        text=True,
        errors="replace",
    )
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
    printed = out if mode == "off" else (cwd / "trace" / "cmd.log").read_text(errors="replace")
    ms = [float(m) for m in re.findall(r"^HCTOOL_BENCH_MS ([\d.]+)$", printed, re.M)]
    res["ms"] = max(ms) if len(ms) == 2 else None  # the slower rank
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
    ap.add_argument("--n", type=int, default=30, help="timed epochs (ddp) or steps (fsdp2)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hctool-steptime-"))
    folder, argv = program(args.examples, args.case, work)
    runs, ms = [], {"off": [], "on": []}
    for _ in range(args.repeats):
        for mode in ("off", "on"):
            r = run_once(mode, folder, argv, args.n, work, args.timeout)
            runs.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
            if r["exit"] != 0 or r["ms"] is None or r.get("verdict", "consistent") != "consistent":
                raise SystemExit(f"{mode} run failed: {r}")
            ms[mode].append(r["ms"])
    off, on = statistics.median(ms["off"]), statistics.median(ms["on"])
    unit = "epoch (32 steps)" if args.case == "ddp" else "step"
    res = {
        "case": args.case,
        "unit": unit,
        "off_ms": off,
        "on_ms": on,
        "ratio": on / off,
        "ms": ms,
        "n": args.n,
        "repeats": args.repeats,
        "runs": runs,
    }
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
