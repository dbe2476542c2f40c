"""Load-back (host -> device) and backup (device -> host) bandwidth through
HiCacheController, as a fraction of a plain pinned-memory copy of the same bytes in
the same direction, measured in the same run (CUDA only).

    python benchmarks/bench_loadback_gpu.py [--runs 7] [--tokens 16384] [--page-size 16 64]
                                            [--kernel-configs 16384:4,65536:8] [--json]

The model shape is bigger than the engine's default (8 layers, 16 heads x 64): a
16-token page is 64 KiB per layer and buffer, 1 MiB with K and V of every layer, and
--tokens 16384 moves 1 GiB per load. Two layouts of the same pages: contiguous (one run)
and scattered (random host and device pages, nearly every page its own run). Scattered
pages go through engine/page_transfer.py's kernel, and once more with the per-run copies
it replaced (HCENGINE_PAGE_TRANSFER=copy). Loads run as the scheduler runs them, load() +
start_loading() (one launch and one event per layer on the H2D stream) timed until the
last layer's event completes; writes as write() + start_writing(). Medians of --runs
interleaved runs. Before timing, the bytes moved by each case are checked.
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

from engine import page_transfer  # noqa: E402
from engine.managers.cache_controller import HiCacheController  # noqa: E402
from engine.mem_cache.memory_pool import KVPool  # noqa: E402


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def one_page_size(a, page_size: int, configs: list[page_transfer.KernelConfig]) -> dict:
    dev = torch.device("cuda:0")
    n = a.tokens // page_size
    shape = (page_size, a.layers, a.heads, a.head_dim)
    device_pool = KVPool(2 * n, *shape, dev)
    host_pool = KVPool(2 * n, *shape, torch.device("cpu"), pin_memory=True)
    device_pool.k_buffer.normal_()
    device_pool.v_buffer.normal_()
    host_pool.k_buffer.copy_(device_pool.k_buffer)
    host_pool.v_buffer.copy_(device_pool.v_buffer)
    device_pool.k_buffer.normal_()  # so a page not copied differs from its host page
    device_pool.v_buffer.normal_()
    ctrl = HiCacheController(device_pool, host_pool, dev)
    nbytes = n * host_pool.page_bytes()
    pinned = torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=True)
    on_device = torch.empty(nbytes // 4, dtype=torch.float32, device=dev)

    def load(host_pages, device_pages):
        ctrl.load(host_pages, device_pages, None)
        slot = ctrl.start_loading()
        ctrl.layer_done_counter.events[slot][-1].synchronize()
        ctrl.ack_load_queue.clear()

    def write(device_pages, host_pages):
        ctrl.write(device_pages, host_pages, None)
        ctrl.start_writing().synchronize()
        ctrl.ack_write_queue.clear()

    def forced(fn):  # the kernel even for one long run: its own ceiling
        def run():
            keep, page_transfer.RUN_BYTES_FOR_COPY = page_transfer.RUN_BYTES_FOR_COPY, 1 << 62
            try:
                fn()
            finally:
                page_transfer.RUN_BYTES_FOR_COPY = keep

        return run

    rng = random.Random(0)
    contiguous = (list(range(n)), list(range(n)))
    scattered = (rng.sample(range(2 * n), n), rng.sample(range(2 * n), n))
    # name -> (direction, function, kernel config or None for per-run copies)
    cases = {
        "h2d plain pinned copy": ("h2d", lambda: on_device.copy_(pinned, non_blocking=True), None),
        "d2h plain pinned copy": ("d2h", lambda: pinned.copy_(on_device, non_blocking=True), None),
        "load contiguous": ("h2d", lambda: load(*contiguous), configs[0]),
        "load contiguous (kernel forced)": ("h2d", forced(lambda: load(*contiguous)), configs[0]),
        "load scattered (per-run copies)": ("h2d", lambda: load(*scattered), None),
        "write contiguous": ("d2h", lambda: write(*contiguous), configs[0]),
        "write contiguous (kernel forced)": ("d2h", forced(lambda: write(*contiguous)), configs[0]),
        "write scattered (per-run copies)": ("d2h", lambda: write(*scattered), None),
    }
    for c in configs:
        tag = "" if c == configs[0] else f" [kernel {c.block_bytes}B/{c.num_warps}w]"
        cases[f"load scattered{tag}"] = ("h2d", lambda: load(*scattered), c)
        cases[f"write scattered{tag}"] = ("d2h", lambda: write(*scattered), c)

    def run(name: str) -> float:
        _, fn, cfg = cases[name]
        page_transfer.set_backend(cfg is not None, cfg)
        return timed(fn)

    paths = {}
    for name in cases:  # warm up (compiles the kernel), then check what was moved
        moves = name.startswith(("load", "write"))
        if moves:  # fresh device bytes: a copy that did nothing cannot pass the check
            device_pool.k_buffer.normal_()
            device_pool.v_buffer.normal_()
        before = page_transfer.launches()
        run(name)
        paths[name] = "kernel" if page_transfer.launches() > before else "copies"
        if moves:
            check(name, host_pool, device_pool, contiguous if "contiguous" in name else scattered)
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(a.runs):  # interleaved, so drift hits every case alike
        for name in cases:
            samples[name].append(run(name))
    page_transfer.set_backend(True, configs[0])
    ctrl.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    gbps = {k: nbytes / t / 1e9 for k, t in med.items()}
    plain = {d: gbps[f"{d} plain pinned copy"] for d in ("h2d", "d2h")}
    return {
        "page_size": page_size,
        "pages": n,
        "bytes": nbytes,
        "page_bytes": host_pool.page_bytes(),
        "path": paths,
        "median_seconds": med,
        "GB_per_s": gbps,
        "fraction_of_plain": {k: gbps[k] / plain[cases[k][0]] for k in cases},
    }


def check(name: str, host_pool: KVPool, device_pool: KVPool, pages) -> None:
    """The destination pages hold the source pages' bytes."""
    a, b = pages
    host_pages, device_pages = (a, b) if name.startswith("load") else (b, a)
    hs, ds = host_pool.page_slots(host_pages), device_pool.page_slots(device_pages).to("cuda:0")
    for hbuf, dbuf in ((host_pool.k_buffer, device_pool.k_buffer), (host_pool.v_buffer, device_pool.v_buffer)):
        if not torch.equal(dbuf[:, ds].cpu(), hbuf[:, hs]):
            sys.exit(f"Error: {name}: destination pages differ from the source pages")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=16384, help="tokens moved per load (pages = tokens / page size)")
    ap.add_argument("--page-size", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument(
        "--kernel-configs",
        default="",
        help="BLOCK_BYTES:NUM_WARPS,... kernel variants to time (the first is the one the engine uses)",
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("Error: needs CUDA (this benchmark measures host<->device copies)")
    torch.cuda.set_device(0)
    configs = [page_transfer.KernelConfig()]
    for item in filter(None, a.kernel_configs.split(",")):
        b, w = item.split(":")
        configs.append(page_transfer.KernelConfig(int(b), int(w)))
    if a.kernel_configs:
        configs = configs[1:]
    results = [one_page_size(a, p, configs) for p in a.page_size]
    out = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "runs": a.runs,
        "shape": {"layers": a.layers, "heads": a.heads, "head_dim": a.head_dim},
        "results": results,
    }
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{out['device']}, torch {out['torch']}, median of {a.runs} interleaved runs")
    for r in results:
        print(
            f"page {r['page_size']} tokens: {r['pages']} pages x {r['page_bytes'] / 2**20:.2f} MiB "
            f"= {r['bytes'] / 2**30:.2f} GiB"
        )
        for k, g in r["GB_per_s"].items():
            print(f"  {k:42s} {g:7.1f} GB/s  {r['fraction_of_plain'][k]:.2f} of plain  ({r['path'][k]})")


if __name__ == "__main__":
    main()
