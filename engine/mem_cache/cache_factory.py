"""SGLang: srt/managers/scheduler.py (init_cache_with_memory_pool picks the tree cache).

The one place that decides which prefix cache a rank runs, from ServerArgs: a
RadixCache (or a disabled one, the no-cache reference), or a HiRadixCache with
its host pool and optional L3 storage. The scheduler only sees BasePrefixCache.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from engine.lab.seams import SEAMS
from engine.managers.pp_sync import StageSync, min_host_pages
from engine.mem_cache.base_prefix_cache import BasePrefixCache
from engine.mem_cache.hicache_page import writer_identity
from engine.mem_cache.hicache_storage import HiCacheFile, StorageIO
from engine.mem_cache.hiradix_cache import HiRadixCache
from engine.mem_cache.memory_pool import KVPool, PagedAllocator
from engine.mem_cache.radix_cache import RadixCache
from engine.server_args import ServerArgs


def host_pool_pages(args: ServerArgs, device_pool: KVPool) -> int:
    if args.hicache_size > 0:
        pages = max(1, int(args.hicache_size * 1e9) // device_pool.page_bytes())
    else:
        pages = int(args.max_total_tokens // args.page_size * args.hicache_ratio)
    # A seam: a fault can make this rank's pinned pool come out smaller (a rank-local resource).
    return max(1, SEAMS.host_pool_pages(pages))


def create_tree_cache(
    args: ServerArgs,
    allocator: PagedAllocator,
    device_pool: KVPool,
    tp_cpu_group,
    io_group,
    tp_rank: int,
    tp_size: int,
    device: torch.device,
    parallel=None,
) -> BasePrefixCache:
    """parallel: the rank's ParallelState; under PP each stage's cache holds its own layers,
    and its agreements reach across stages as --pp-hicache-sync says."""
    p, cfg = args.page_size, args.model
    if not args.enable_hierarchical_cache or args.decode_radix_disabled:
        return RadixCache(
            p,
            allocator,
            disable=args.disable_radix_cache or args.decode_radix_disabled,
            lru_clock=args.variants.lru_clock,
        )
    pp = parallel is not None and parallel.pp_size > 1
    mode = args.variants.pp_hicache_sync
    host_pages = host_pool_pages(args, device_pool)
    if pp and mode != "per-stage":  # #29258: no stage has a larger host pool than another
        host_pages = min_host_pages(host_pages, parallel.world_cpu_group)
    host_pool = KVPool(
        host_pages,
        p,
        device_pool.num_layers,
        cfg.num_heads // tp_size,
        cfg.head_dim,
        torch.device("cpu"),
        pin_memory=device.type == "cuda",
    )
    storage_io = None
    if args.hicache_storage_backend == "file":
        directory = args.hicache_storage_dir or os.path.join(args.run_dir or ".", "storage")
        shape = (2, device_pool.num_layers, p, cfg.num_heads // tp_size, cfg.head_dim)
        identity = writer_identity(dataclasses.asdict(cfg), "float32", p, tp_size, tp_rank, shape)
        pp_rank, pp_size = (parallel.pp_rank, parallel.pp_size) if pp else (0, 1)
        io_sync = StageSync(mode, io_group, parallel.world_io_group, pp_rank) if pp else None
        storage_io = StorageIO(
            HiCacheFile(directory, tp_rank, tp_size, identity, pp_rank, pp_size),
            host_pool,
            io_group,
            p,
            args.variants.storage_hit_sync,
            io_sync,
        )
    sync = StageSync(mode, tp_cpu_group, parallel.world_cpu_group, parallel.pp_rank) if pp else None
    return HiRadixCache(
        args,
        allocator,
        device_pool,
        host_pool,
        PagedAllocator(host_pages, p, "host"),
        tp_cpu_group,
        device,
        storage_io,
        sync,
    )
