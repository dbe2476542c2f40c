"""Page gather/scatter between pinned host and device KV pools in one kernel launch
(SGLang: sgl_kernel's transfer_kv_per_layer / transfer_kv_all_layer, io_backend="kernel").

Why: `copy_pages` issues one copy per page run, layer and buffer. For scattered small
pages the cost per copy (submission plus DMA setup), not PCIe, bounds load-back:
scattered 16-token pages ran at 0.07-0.25 of a pinned contiguous copy on H200. Here one
Triton program moves one chunk of one page: it reads (or writes) the pinned host pool
through its device-visible address, since pinned memory from torch (cudaHostAlloc) is
mapped into the unified address space, so a launch per layer moves every page at once.

Taken only for host<->device copies whose mean run is small (below RUN_BYTES_FOR_COPY
per layer and buffer, where per-run copies already run at copy-engine speed). Where the
kernel cannot run (no Triton, host pool not pinned, shapes differ, a failed launch) the
caller's per-run copies are used, and the reason is logged once. CPU pools never reach
here. HCENGINE_PAGE_TRANSFER=copy turns the kernel off (benchmarks compare both).
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

import torch

log = logging.getLogger(__name__)

# A per-run copy costs 7-11 us beyond its bytes (measured on H200: 16384 scattered
# 64 KiB copies took 176 ms); at 55 GB/s only runs of a few MiB hide that as well as the
# kernel does (~0.9 of a pinned copy). Longer runs stay on the copy engine (and off SMs).
RUN_BYTES_FOR_COPY = 4 << 20


class KernelConfig(NamedTuple):
    block_bytes: int = 16384  # bytes of one buffer one program moves (a page or a chunk)
    num_warps: int = 4


class _State:
    enabled = os.environ.get("HCENGINE_PAGE_TRANSFER", "kernel") != "copy"
    config = KernelConfig()
    kernel = None  # the compiled-on-demand Triton function, once imported
    unavailable: str | None = None  # why the kernel path is off
    logged: set[str] = set()  # fallback reasons already logged
    launches = 0  # kernel launches so far (tests check the kernel ran)
    cache: tuple | None = None  # (src_pages, dst_pages, runs, CPU pairs, {stream: device pairs})


def set_backend(kernel: bool, config: KernelConfig | None = None) -> None:
    """Turn the kernel path on or off (benchmarks and tests); reset a past failure."""
    _State.enabled, _State.unavailable, _State.cache = kernel, None, None
    _State.logged.clear()
    if config is not None:
        _State.config = config


def launches() -> int:
    return _State.launches


def _fall_back(reason: str, disable: bool = True) -> None:
    """Log a reason once; `disable` turns the kernel off for this process."""
    if reason not in _State.logged:
        _State.logged.add(reason)
        log.warning("page_transfer: %s; host<->device page copies use one copy per page run", reason)
    if disable:
        _State.unavailable = reason


def _load_kernel():
    if _State.kernel is None:
        try:
            _State.kernel = _build_kernel()
        except ImportError as e:  # no Triton in this environment
            _fall_back(f"Triton unavailable ({e})")
    return _State.kernel


def _build_kernel():
    """Import Triton only when a host<->device copy first needs it (CPU runs never do)."""
    global tl
    import triton
    import triton.language as tl

    # n and first_layer vary per call: specializing on their values (== 1, % 16) would
    # compile new variants in the middle of serving.
    @triton.jit(do_not_specialize=["n", "first_layer"])
    def _copy_pages(
        src_k,
        src_v,
        dst_k,
        dst_v,
        idx,
        n,
        first_layer,
        src_layer_stride,
        dst_layer_stride,
        PAGE: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # grid: (page pair, chunk of the page, layer); idx holds [src pages..., dst pages...]
        i = tl.program_id(0)
        chunk = tl.program_id(1)
        layer = first_layer + tl.program_id(2).to(tl.int64)
        s = tl.load(idx + i)
        d = tl.load(idx + n + i)
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        so = layer * src_layer_stride + s * PAGE + offs
        do = layer * dst_layer_stride + d * PAGE + offs
        if PAGE % BLOCK == 0:  # no tail: unmasked, 16-byte accesses
            k = tl.load(src_k + so)
            v = tl.load(src_v + so)  # both loads in flight before the first store
            tl.store(dst_k + do, k)
            tl.store(dst_v + do, v)
        else:
            m = offs < PAGE
            k = tl.load(src_k + so, mask=m)
            v = tl.load(src_v + so, mask=m)
            tl.store(dst_k + do, k, mask=m)
            tl.store(dst_v + do, v, mask=m)

    def launch(src, dst, idx, n, page_elems, first, count, cfg: KernelConfig, warmup: bool = False):
        esize = src.k_buffer.element_size()
        block = min(triton.next_power_of_2(page_elems), max(cfg.block_bytes // esize, 1))
        grid = (n, triton.cdiv(page_elems, block), count)
        args = (
            src.k_buffer,
            src.v_buffer,
            dst.k_buffer,
            dst.v_buffer,
            idx,
            n,
            first,
            src.k_buffer.stride(0),
            dst.k_buffer.stride(0),
        )
        opts = dict(PAGE=page_elems, BLOCK=block, num_warps=cfg.num_warps)
        if warmup:  # compile only
            _copy_pages.warmup(*args, grid=grid, **opts)
        else:
            _copy_pages[grid](*args, **opts)

    return launch


def _indices(src_pages: list[int], dst_pages: list[int]) -> tuple[int, torch.Tensor]:
    """Number of runs of the page pairs and the pairs as [src..., dst...] (CPU). Cached
    for the last lists: a load-back calls once per layer with the same lists."""
    hit = _State.cache
    if hit is not None and hit[0] == src_pages and hit[1] == dst_pages:
        return hit[2], hit[3]
    idx = torch.tensor(src_pages + dst_pages, dtype=torch.int64)
    n = len(src_pages)
    s, d = idx[:n], idx[n:]
    runs = 1 + int(((s[1:] != s[:-1] + 1) | (d[1:] != d[:-1] + 1)).sum())
    _State.cache = (list(src_pages), list(dst_pages), runs, idx, {})
    return runs, idx


def _device_indices(idx: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The cached pairs on `device`, uploaded once per stream (the caching allocator ties
    a block to the stream it was allocated on). Pinned + non_blocking, because a
    pageable copy would make the host wait for the copy stream."""
    per_stream = _State.cache[4]
    stream = torch.cuda.current_stream(device).cuda_stream
    if stream not in per_stream:
        per_stream[stream] = idx.pin_memory().to(device, non_blocking=True)
    return per_stream[stream]


def _usable(src, dst) -> bool:
    """Host<->device pools with the same pages, the kernel on and loadable."""
    sk, dk = src.k_buffer, dst.k_buffer
    if sk.is_cuda == dk.is_cuda or not _State.enabled or _State.unavailable:
        return False
    if (
        sk.dtype != dk.dtype
        or sk.shape[0] != dk.shape[0]
        or sk.shape[2:] != dk.shape[2:]
        or src.page_size != dst.page_size
        or not (sk.is_contiguous() and dk.is_contiguous())
    ):
        return False  # not the same page shape: the per-run copies raise or convert
    if not (dk if sk.is_cuda else sk).is_pinned():  # the host side
        _fall_back("a host KV pool is not pinned memory", disable=False)
        return False
    return _load_kernel() is not None


def warm_up(device_pool, host_pool) -> None:
    """Compile the kernel for these pools now, at the controller's start, so the first
    load-back does not stall the scheduler on a compile (and a failure shows here)."""
    if not _usable(host_pool, device_pool):
        return
    dev = device_pool.k_buffer.device
    page_elems = host_pool.page_size * host_pool.k_buffer[0, 0].numel()
    with torch.cuda.device(dev):
        idx = torch.zeros(2, dtype=torch.int64, device=dev)
        try:
            for src, dst in ((host_pool, device_pool), (device_pool, host_pool)):
                _State.kernel(src, dst, idx, 1, page_elems, 0, 1, _State.config, warmup=True)
        except Exception as e:
            _fall_back(f"kernel compile failed ({type(e).__name__}: {e})")


def transfer_pages(src, dst, src_pages: list[int], dst_pages: list[int], layer: int | None) -> bool:
    """Copy the pages with the kernel if this copy should take it; False means the
    caller copies run by run (CPU pools, device->device, large runs, no kernel)."""
    if not src_pages or not _usable(src, dst):
        return False
    sk = src.k_buffer
    dev = dst.k_buffer.device if dst.k_buffer.is_cuda else sk.device
    page_elems = src.page_size * sk[0, 0].numel()
    runs, idx = _indices(src_pages, dst_pages)
    if len(src_pages) * page_elems * sk.element_size() >= runs * RUN_BYTES_FOR_COPY:
        return False  # long runs: per-run copies already run at copy-engine speed
    first, count = (0, sk.shape[0]) if layer is None else (layer, 1)
    with torch.cuda.device(dev):
        try:
            _State.kernel(src, dst, _device_indices(idx, dev), len(src_pages), page_elems, first, count, _State.config)
        except Exception as e:  # a compile or launch failure: no page was copied yet
            _fall_back(f"kernel launch failed ({type(e).__name__}: {e})")
            return False
    _State.launches += 1
    return True
