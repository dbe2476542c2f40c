"""engine/page_transfer.py on CUDA: scattered load-back (host -> device, per layer, as
start_loading submits it) and backup (device -> host, all layers, as start_writing
does) through the kernel leave exactly the bytes a per-page reference copy leaves, for
random page lists and page shapes; without the kernel the per-run copies take over,
and say so once."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from engine import page_transfer
from engine.managers.cache_controller import HiCacheController
from engine.mem_cache.memory_pool import KVPool

pytestmark = pytest.mark.timeout(300)
CUDA = torch.device("cuda:0")
# (page_size, heads, head_dim): the bench's 64 KiB pages (4 programs a page), the
# engine's 8 KiB pages (one program a page), and 60-byte pages (the masked tail).
SHAPES = [(16, 16, 64), (16, 4, 32), (1, 3, 5)]


def random_bits(pool: KVPool) -> None:
    """Every bit pattern, NaNs included: the copy must move bytes, not floats."""
    for buf in (pool.k_buffer, pool.v_buffer):
        bits = torch.randint(-(2**31), 2**31 - 1, buf.shape, dtype=torch.int32)
        buf.view(torch.int32).copy_(bits)


def random_pairs(rng: random.Random, src_total: int, dst_total: int) -> tuple[list[int], list[int]]:
    """Distinct destination pages, sources drawn at random, in runs of 1-3 pages."""
    n = rng.randint(1, min(src_total, dst_total) // 2)
    src, dst = [], []
    free_dst = rng.sample(range(dst_total - 3), n)
    used = set()
    for d0 in free_dst:
        length = rng.randint(1, 3)
        s0 = rng.randrange(src_total - length)
        for j in range(length):
            if d0 + j not in used:
                used.add(d0 + j)
                src.append(s0 + j)
                dst.append(d0 + j)
    return src, dst


def reference(src: KVPool, dst: KVPool, src_pages, dst_pages) -> tuple[torch.Tensor, torch.Tensor]:
    """dst's buffers after copying each page on its own (on the CPU)."""
    p = src.page_size
    k, v = dst.k_buffer.cpu().clone(), dst.v_buffer.cpu().clone()
    sk, sv = src.k_buffer.cpu(), src.v_buffer.cpu()
    for s, d in zip(src_pages, dst_pages):
        k[:, d * p : (d + 1) * p] = sk[:, s * p : (s + 1) * p]
        v[:, d * p : (d + 1) * p] = sv[:, s * p : (s + 1) * p]
    return k, v


def assert_bytes_equal(pool: KVPool, want: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert torch.equal(pool.k_buffer.cpu().view(torch.int32), want[0].view(torch.int32))
    assert torch.equal(pool.v_buffer.cpu().view(torch.int32), want[1].view(torch.int32))


def make_pools(shape, pinned: bool = True):
    page_size, heads, head_dim = shape
    device_pool = KVPool(40, page_size, 3, heads, head_dim, CUDA)
    host_pool = KVPool(64, page_size, 3, heads, head_dim, torch.device("cpu"), pin_memory=pinned)
    return device_pool, host_pool


def roundtrip(ctrl: HiCacheController, rng: random.Random) -> None:
    """One random load-back and one random backup, each checked against the reference."""
    device_pool, host_pool = ctrl.device_pool, ctrl.host_pool
    random_bits(host_pool)
    random_bits(device_pool)
    host_pages, device_pages = random_pairs(rng, 64, 40)
    want = reference(host_pool, device_pool, host_pages, device_pages)
    ctrl.load(host_pages, device_pages, None)
    slot = ctrl.start_loading()
    for ev in ctrl.layer_done_counter.events[slot]:  # one event per layer, as the forward waits
        ev.synchronize()
    assert_bytes_equal(device_pool, want)

    random_bits(device_pool)
    device_pages, host_pages = random_pairs(rng, 40, 64)
    want = reference(device_pool, host_pool, device_pages, host_pages)
    ctrl.write(device_pages, host_pages, None)
    ctrl.start_writing().synchronize()
    assert_bytes_equal(host_pool, want)


@pytest.fixture
def kernel_on():
    page_transfer.set_backend(True)
    yield
    page_transfer.set_backend(True)


@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_moves_the_reference_bytes(shape, kernel_on):
    pytest.importorskip("triton")
    device_pool, host_pool = make_pools(shape)
    ctrl = HiCacheController(device_pool, host_pool, CUDA)
    rng = random.Random(sum(shape))
    before = page_transfer.launches()
    for _ in range(5):
        roundtrip(ctrl, rng)
    ctrl.close()
    # 5 x (3 per-layer loads + 1 all-layer write): the kernel ran, no copy fell back
    assert page_transfer.launches() - before == 5 * 4


def test_without_kernel_per_run_copies_move_the_same_bytes(kernel_on):
    page_transfer.set_backend(False)
    device_pool, host_pool = make_pools(SHAPES[0])
    ctrl = HiCacheController(device_pool, host_pool, CUDA)
    before = page_transfer.launches()
    roundtrip(ctrl, random.Random(1))
    assert page_transfer.launches() == before
    ctrl.close()


def test_unpinned_host_pool_falls_back_and_says_so_once(kernel_on, caplog):
    device_pool, host_pool = make_pools(SHAPES[1], pinned=False)
    ctrl = HiCacheController(device_pool, host_pool, CUDA)
    before = page_transfer.launches()
    with caplog.at_level(logging.WARNING, logger="engine.page_transfer"):
        roundtrip(ctrl, random.Random(2))
        roundtrip(ctrl, random.Random(3))
    ctrl.close()
    assert page_transfer.launches() == before
    said = [r.getMessage() for r in caplog.records if "not pinned" in r.getMessage()]
    assert len(said) == 1, said
