"""How fast `check-consensus analyze` reads hctool's own traces: calls per second and peak memory.

Writes trace folders in the recorder's format (hctool/protocol/records.py: a side table of
interned names and a ring of 64-byte records per rank), as a training loop leaves them (a few
call sites per step, all_reduce and broadcast on the default group and a subgroup), optionally
with one rank inserting one extra same-shape call at a chosen position, then times
`analyze_dir` on them in a fresh process (peak RSS from getrusage) and checks the answer.

    python benchmarks/bench_analyze.py --ranks 8 --calls 1250000 [--extra-at 1000000] [--runs 3] [--paths columns,dicts]

"--paths dicts" times the per-event path the analyzer had before the column fast path
(HCTOOL_ANALYZE_COLUMNS=0), for the ratio in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hctool.consensus.columns import RECORD_DTYPE  # noqa: E402
from hctool.protocol.records import KIND_CALL, STATE_COMPLETED  # noqa: E402

STEP = [  # (op, group id, site id, desc id, reduce op id): one training step's calls. The default group's two
    # gradient all_reduces have one shape, so an extra one pairs silently to the end (the commonest bug)
    ("all_reduce", 1, 1, 1, 1),
    ("all_reduce", 1, 2, 1, 1),
    ("all_reduce", 2, 3, 2, 1),
    ("broadcast", 2, 4, 3, 0),
]


def write_rank(folder: Path, rank: int, world: int, calls: int, extra_at: int | None, run: str) -> None:
    pid = 1000 + rank
    side = [
        {
            "hdr": 2,
            "rank": rank,
            "world_size": world,
            "pid": pid,
            "host": "bench",
            "argv": ["train.py"],
            "start": 1.0e9,
            "mono": 100.0,
            "record_size": 64,
            "fastpath": "c",
            "c10d_kernel": "c++",
            "run": run,
        },
        {
            "grp": f"0:{json.dumps(list(range(world)), separators=(',', ':'))}",
            "idx": 0,
            "ranks": list(range(world)),
            "id": 1,
        },
        {
            "grp": f"1:{json.dumps(list(range(world)), separators=(',', ':'))}",
            "idx": 1,
            "ranks": list(range(world)),
            "id": 2,
        },
        {"i": "op", "id": 1, "v": "all_reduce"},
        {"i": "op", "id": 2, "v": "broadcast"},
        {"i": "ro", "id": 1, "v": "SUM"},
        {"i": "th", "id": 1, "v": "MainThread"},
        {"i": "desc", "id": 1, "v": {"sh": [[1024]], "dt": ["float32"]}},
        {"i": "desc", "id": 2, "v": {"sh": [[16]], "dt": ["float32"]}},
        {"i": "desc", "id": 3, "v": {"sh": [[4]], "dt": ["int64"]}},
    ]
    for sid, line in ((1, 40), (2, 41), (3, 52), (4, 60), (5, 77)):
        side.append(
            {
                "i": "site",
                "id": sid,
                "v": {
                    "site": f"train.py:{line}",
                    "fn": "step",
                    "stack": [f"/bench/train.py:{line} step", "/bench/train.py:90 main"],
                },
            }
        )
    n = calls + (1 if extra_at is not None and rank == 1 else 0)
    rows = np.zeros(n, dtype=RECORD_DTYPE)
    idx = np.arange(calls)
    pat = np.array([(o == "broadcast") + 1 for o, *_ in STEP])[idx % len(STEP)]
    grp = np.array([g for _, g, *_ in STEP])[idx % len(STEP)]
    site = np.array([s for *_, s, _d, _r in STEP])[idx % len(STEP)]
    desc = np.array([d for *_, d, _r in STEP])[idx % len(STEP)]
    ro = np.array([r for *_, r in STEP])[idx % len(STEP)]
    cols = {"op": pat, "group": grp, "site": site, "desc": desc, "ro": ro}
    if extra_at is not None and rank == 1:  # one extra same-shape all_reduce from line 77, paired silently
        for k, v in cols.items():
            extra = {"op": 1, "group": 1, "site": 5, "desc": 1, "ro": 1}[k]
            cols[k] = np.insert(v, extra_at, extra)
    rows["kind"], rows["state"] = KIND_CALL, STATE_COMPLETED
    for k, v in cols.items():
        rows[k] = v
    rows["th"], rows["root"] = 1, -1
    rows["root"][rows["op"] == 2] = 0
    rows["seq"] = np.arange(n)
    rows["t"] = 100.0 + np.arange(n) * 1e-5
    rows["t_done"] = rows["t"] + 5e-6
    base = folder / f"rank{rank}-{pid}"
    (base.with_suffix(".jsonl")).write_text(
        "".join(json.dumps(x) + "\n" for x in side) + json.dumps({"end": 1, "t": 100.0 + n * 1e-5 + 1}) + "\n"
    )
    size = -(-rows.nbytes // (1 << 20)) << 20
    with open(base.with_suffix(".ring"), "wb") as f:
        f.write(rows.tobytes())
        f.truncate(size)


def make(folder: Path, ranks: int, calls: int, extra_at: int | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hctool.lock").write_text(json.dumps({"run": "bench"}))
    for r in range(ranks):
        write_rank(folder, r, ranks, calls, extra_at, "bench")


CHILD = """
import json, resource, sys, time, os
from hctool.consensus import analyze_dir
t = time.perf_counter()
r = analyze_dir(sys.argv[1])
dt = time.perf_counter() - t
fd = r.first_divergence
print(json.dumps({"seconds": dt, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "verdict": r.verdict.value, "cause": fd.cause_line() if fd else None}))
"""


def time_it(folder: Path, path: str) -> dict:
    env = dict(os.environ, HCTOOL_ANALYZE_COLUMNS="0" if path == "dicts" else "1")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True, env=env, timeout=3600
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--calls", type=int, default=1_250_000, help="calls per rank")
    ap.add_argument("--extra-at", type=int, default=None, help="rank 1 inserts one extra call at this position")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--paths", default="columns", help="columns,dicts")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hctool-bench-analyze-") as tmp:
        folder = Path(tmp) / "trace"
        t0 = time.perf_counter()
        make(folder, args.ranks, args.calls, args.extra_at)
        total = args.ranks * args.calls
        print(f"{total:,} calls on {args.ranks} ranks written in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        for path in args.paths.split(","):
            res = [time_it(folder, path) for _ in range(args.runs)]
            secs = statistics.median(r["seconds"] for r in res)
            print(
                json.dumps(
                    {
                        "path": path,
                        "ranks": args.ranks,
                        "calls": total,
                        "runs": args.runs,
                        "median_s": round(secs, 2),
                        "calls_per_s": round(total / secs),
                        "peak_rss_mb": round(max(r["rss_mb"] for r in res)),
                        "verdict": res[0]["verdict"],
                        "cause": res[0]["cause"],
                    }
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
