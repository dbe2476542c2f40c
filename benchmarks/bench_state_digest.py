"""What --state-digest costs per tick: building the replicated-state record and its
digest, for radix trees of several sizes, next to one decode step of the engine's
model (the work a tick does anyway). In-process, one rank, no collectives: the
digest rides the tick's existing all_reduce, so this is its whole extra cost.

    python benchmarks/bench_state_digest.py [--repeats 200] [--json]
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

from engine.managers.state_digest import StateDigest  # noqa: E402
from engine.mem_cache.cache_factory import create_tree_cache  # noqa: E402
from engine.mem_cache.memory_pool import KVPool, PagedAllocator  # noqa: E402
from engine.model_executor.model import ForwardItem, TinyTransformer  # noqa: E402
from engine.server_args import ServerArgs  # noqa: E402


def _median_us(fn, repeats: int) -> tuple[float, float]:
    """(min, median) µs: on a shared box the minimum is the cost, the median shows the load."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e6, statistics.median(times) * 1e6


def digest_cost(nodes: int, repeats: int):
    """(min, median) µs of one digest over a tree of about `nodes` nodes (inserted prompts
    that share prefixes, so the tree branches)."""
    p = 16
    args = ServerArgs(enable_hierarchical_cache=True, max_total_tokens=p * nodes * 4, page_size=p)
    cfg = args.model
    pages = args.max_total_tokens // p
    allocator = PagedAllocator(pages, p, "device")
    pool = KVPool(pages, p, cfg.num_layers, cfg.num_heads, cfg.head_dim, torch.device("cpu"))
    tree = create_tree_cache(args, allocator, pool, None, None, 0, 1, torch.device("cpu"))
    rng = random.Random(0)
    trunks = [[rng.randrange(1, 30000) for _ in range(2 * p)] for _ in range(max(1, nodes // 8))]
    while sum(1 for _ in tree.nodes()) < nodes:
        key = rng.choice(trunks) + [rng.randrange(1, 30000) for _ in range(2 * p)]
        got = tree.alloc_pages(len(key) // p)
        if got is None:
            break
        res = tree.insert(key, got)
        allocator.free(res.duplicate_pages)
    waiting = [type("R", (), {"rid": f"r{i}"})() for i in range(16)]
    sd = StateDigest("", 0)
    cost = _median_us(lambda: sd.digest(waiting, waiting[:8], tree), repeats)
    tree.close()
    return cost, sum(1 for _ in tree.nodes())


def decode_step_cost(repeats: int):
    """(min, median) µs of one decode forward of 8 requests with 512 tokens of context."""
    args = ServerArgs()
    cfg = args.model
    model = TinyTransformer(cfg, 0, 1, torch.device("cpu"))
    pool = KVPool(512, 16, cfg.num_layers, cfg.num_heads, cfg.head_dim, torch.device("cpu"))
    items = [ForwardItem([5], 511, torch.arange(i * 512, (i + 1) * 512) % (512 * 16)) for i in range(8)]
    return _median_us(lambda: model.forward(items, pool), max(10, repeats // 10))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = [digest_cost(n, a.repeats) for n in (50, 200, 1000)]
    step = decode_step_cost(a.repeats)
    if a.json:
        print(
            json.dumps(
                {
                    "decode_step_us": {"min": step[0], "median": step[1]},
                    "digest": [{"nodes": n, "min_us": us[0], "median_us": us[1]} for us, n in rows],
                }
            )
        )
        return
    print(f"one decode step (8 requests x 512 context): min {step[0]:.0f} us, median {step[1]:.0f} us")
    for us, n in rows:
        print(f"digest, {n} nodes: min {us[0]:.0f} us ({us[0] / step[0]:.3f} of a decode step), median {us[1]:.0f} us")


if __name__ == "__main__":
    main()
