"""Load-back bandwidth host -> device through HiCacheController, as a fraction of a
plain pinned-memory copy of the same bytes measured in the same run (CUDA only).

    python benchmarks/bench_loadback_gpu.py [--runs 7] [--pages 256] [--page-size 64] [--json]

A bigger model shape than the engine's default (8 layers, 16 heads x 64) makes pages
4 MiB, so per-copy overheads do not dominate. Two layouts of the same pages are timed:
contiguous (one run per layer and buffer) and scattered (every page its own run), with
load()/start_loading() exactly as the scheduler calls them, timed from submission until
the last layer's event completes.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.managers.cache_controller import HiCacheController  # noqa: E402
from engine.mem_cache.memory_pool import KVPool  # noqa: E402


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--pages", type=int, default=256)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    n = a.pages
    device_pool = KVPool(2 * n, a.page_size, a.layers, a.heads, a.head_dim, dev)
    host_pool = KVPool(2 * n, a.page_size, a.layers, a.heads, a.head_dim, torch.device("cpu"), pin_memory=True)
    host_pool.k_buffer.normal_()
    host_pool.v_buffer.normal_()
    ctrl = HiCacheController(device_pool, host_pool, dev)
    nbytes = n * host_pool.page_bytes()

    # the baseline: one pinned buffer of the same size, one non_blocking copy
    src = torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=True)
    dst = torch.empty(nbytes // 4, dtype=torch.float32, device=dev)

    def plain():
        dst.copy_(src, non_blocking=True)

    def loadback(host_pages, device_pages):
        def run():
            ctrl.load(host_pages, device_pages, None)
            slot = ctrl.start_loading()
            ctrl.layer_done_counter.events[slot][-1].synchronize()
            ctrl.ack_load_queue.clear()
        return run

    rng = random.Random(0)
    layouts = {
        "contiguous": (list(range(n)), list(range(n))),
        "scattered": (rng.sample(range(2 * n), n), rng.sample(range(2 * n), n)),
    }
    for fn in [plain] + [loadback(*v) for v in layouts.values()]:
        fn()  # warm up
    # correctness of what was timed: the device pages hold the host pages' bytes
    hp, dp = layouts["scattered"]
    hs, ds = host_pool.page_slots(hp), device_pool.page_slots(dp).to(dev)
    assert torch.equal(device_pool.k_buffer[:, ds].cpu(), host_pool.k_buffer[:, hs])

    samples = {"plain_pinned_copy": [], **{k: [] for k in layouts}}
    for _ in range(a.runs):  # interleaved, so drift hits every variant alike
        samples["plain_pinned_copy"].append(timed(plain))
        for k, v in layouts.items():
            samples[k].append(timed(loadback(*v)))
    med = {k: statistics.median(v) for k, v in samples.items()}
    gbps = {k: nbytes / t / 1e9 for k, t in med.items()}
    result = {
        "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
        "bytes": nbytes, "page_bytes": host_pool.page_bytes(), "pages": n, "runs": a.runs,
        "median_seconds": med, "GB_per_s": gbps,
        "fraction_of_plain": {k: gbps[k] / gbps["plain_pinned_copy"] for k in layouts},
    }
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{result['device']}: {n} pages x {host_pool.page_bytes() / 2**20:.1f} MiB = {nbytes / 2**30:.2f} GiB, "
              f"median of {a.runs}")
        for k in samples:
            frac = "" if k == "plain_pinned_copy" else f"  ({result['fraction_of_plain'][k]:.2f} of plain)"
            print(f"  {k:18s} {gbps[k]:7.1f} GB/s{frac}")
    ctrl.close()


if __name__ == "__main__":
    main()
