"""Engine throughput and time-to-first-token on CPU, through real ranks and HTTP.

    python benchmarks/bench_engine.py [--runs 3] [--json]

- tokens/s of a prefill-heavy workload (16 concurrent clients, 1000-token unique
  prompts, 1 new token) and a decode-heavy one (16 clients, 16-token prompts, 128 new
  tokens), at TP=1 and TP=2; median of --runs repetitions on one server each;
- TTFT (max_new_tokens=1, wall time of the request) of a 3000-token prompt at TP=2:
  uncached, L1 hit, L2 load-back (after a filler prompt evicts it from the device),
  L3 prefetch (after a restart on the same storage directory); one run, as ratios.
Startup time is measured by bench_startup.py.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_startup import machine  # noqa: E402

from engine.server_args import ServerArgs  # noqa: E402
from hctool.launch import Topology  # noqa: E402

TIMEOUT = 600


def generate(url, ids, n):
    r = requests.post(
        url + "/generate",
        json={"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}},
        timeout=TIMEOUT,
    )
    r.raise_for_status()
    return r.json()


def concurrent(url, prompts, n) -> float:
    """Seconds until every client has its answer."""
    errors = []

    def client(ids):
        try:
            generate(url, ids, n)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(p,)) for p in prompts]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    dt = time.perf_counter() - t0
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError(f"requests failed: {errors[:1]}")
    return dt


def throughput(tp: int, runs: int, rng: random.Random) -> dict:
    out = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        Topology(ServerArgs(tp_size=tp, max_total_tokens=32768), Path(tmp) / "run") as topo,
    ):
        url = topo.start(timeout=300)
        generate(url, [1, 2, 3], 2)  # warm up
        for name, plen, new in (("prefill_heavy", 1000, 1), ("decode_heavy", 16, 128)):
            rates = []
            for _ in range(runs):
                prompts = [[rng.randrange(1, 30000) for _ in range(plen)] for _ in range(16)]
                dt = concurrent(url, prompts, new)
                rates.append(16 * (plen + new if name == "prefill_heavy" else new) / dt)
            out[name] = statistics.median(rates)
    return out


def ttft(rng: random.Random) -> dict:
    p = [rng.randrange(1, 30000) for _ in range(3000)]
    filler = [rng.randrange(1, 30000) for _ in range(3000)]
    res = {}

    def timed(url, ids, expect=None):
        t0 = time.perf_counter()
        a = generate(url, ids, 1)
        dt = time.perf_counter() - t0
        if expect:
            got = a["meta_info"]["cached_tokens_details"][expect]
            assert got > 0, (expect, a["meta_info"])
        return dt

    with tempfile.TemporaryDirectory() as tmp:
        flags = dict(
            tp_size=2,
            max_total_tokens=4096,
            enable_hierarchical_cache=True,
            hicache_ratio=4,
            hicache_storage_backend="file",
            hicache_storage_dir=str(Path(tmp) / "store"),
        )
        with Topology(ServerArgs(**flags), Path(tmp) / "run1") as topo:
            url = topo.start(timeout=300)
            generate(url, [1, 2, 3], 2)
            res["uncached"] = timed(url, p)
            res["l1_hit"] = timed(url, p, "device")
            generate(url, filler, 1)  # evicts p from the 4096-token device pool
            res["l2_loadback"] = timed(url, p, "host")
            time.sleep(2)  # let the storage backups land
        with Topology(ServerArgs(**flags), Path(tmp) / "run2") as topo:
            url = topo.start(timeout=300)
            generate(url, [1, 2, 3], 2)
            res["l3_prefetch"] = timed(url, p, "storage")
    return {"seconds": res, "ratio_to_uncached": {k: v / res["uncached"] for k, v in res.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rng = random.Random(0)
    result = {
        "machine": machine(),
        "runs": a.runs,
        "tokens_per_s": {f"tp{tp}": throughput(tp, a.runs, rng) for tp in (1, 2)},
        "ttft_3000_tokens_tp2": ttft(rng),
    }
    if a.json:
        print(json.dumps(result, indent=1))
        return
    print(f"machine: {result['machine']}")
    for tp, r in result["tokens_per_s"].items():
        print(
            f"{tp}: prefill-heavy {r['prefill_heavy']:.0f} tok/s, decode-heavy {r['decode_heavy']:.0f} tok/s "
            f"(median of {a.runs})"
        )
    t = result["ttft_3000_tokens_tp2"]
    for k, v in t["seconds"].items():
        print(f"TTFT {k:12s} {v * 1000:8.1f} ms  ({t['ratio_to_uncached'][k]:.2f}x uncached)")


if __name__ == "__main__":
    main()
