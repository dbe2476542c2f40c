"""In-rank fault hooks on real engine parts (streams, allocator, file store),
in this process: each fault acts only inside its window and on its rank."""

from __future__ import annotations

import time

import pytest
import torch

from hctool.inject import fault_hooks
from hctool.inject.faults import parse_fault


@pytest.fixture
def clock(tmp_path, monkeypatch):
    monkeypatch.setenv("HCTOOL_FAULTS_T0", str(tmp_path / "t0"))
    return tmp_path / "t0"


def test_clock_reads_zero_until_the_workload_starts(clock):
    c = fault_hooks.FaultClock([parse_fault("free-delay:ms=5,start_s=1")], rank=0)
    assert c.now() == 0.0 and c.firing(("free-delay",)) == []
    clock.write_text(repr(time.time() - 2.0))
    time.sleep(0.15)
    assert c.now() >= 2.0 and [f.kind for f in c.firing(("free-delay",))] == ["free-delay"]


def test_nothing_fires_after_the_heal(clock):
    clock.write_text(repr(time.time() - 5.0))
    c = fault_hooks.FaultClock([parse_fault("free-delay:ms=300")], rank=0)
    assert c.firing(("free-delay",))
    clock.write_text(f"{time.time() - 5.0!r} 4.0")  # healed one second ago
    time.sleep(0.15)
    assert c.firing(("free-delay",)) == [] and c.heal == 4.0


def test_live_delays_follow_windows_and_probability(clock):
    clock.write_text(repr(time.time()))
    faults = [parse_fault("free-delay:ms=300,duration_s=60"), parse_fault("storage-latency:ms=7,start_s=60"),
              parse_fault("d2h-sleep:ms=10,p=0.5")]
    live = fault_hooks.LiveDelays(fault_hooks.FaultClock(faults, rank=1), {})
    assert live.get("free", 0.0) == 300 and live.get("storage", 0.0) == 0.0 and live.get("h2d") is None
    draws = [live.get("d2h", 0.0) for _ in range(400)]
    assert set(draws) == {0.0, 10.0} and 120 < draws.count(10.0) < 280


def test_free_delay_defers_real_frees(clock):
    from engine import streams
    from engine.mem_cache import memory_pool
    clock.write_text(repr(time.time()))
    saved = streams.FAULT_DELAYS_MS
    try:
        fault_hooks._patch_streams(streams, fault_hooks.LiveDelays(
            fault_hooks.FaultClock([parse_fault("free-delay:ms=200")], 0), {}))
        alloc = memory_pool.PagedAllocator(8, 16, "device")
        alloc.free(alloc.alloc(4))
        assert alloc.available_size() == 4 * 16 and alloc.logical_available_size() == 8 * 16
        time.sleep(0.25)
        assert alloc.available_size() == 8 * 16
    finally:
        streams.FAULT_DELAYS_MS = saved


def test_storage_faults_on_a_real_file_store(clock, tmp_path):
    from engine.mem_cache import hicache_storage as storage
    from engine.mem_cache.memory_pool import KVPool
    clock.write_text(repr(time.time()))
    cls = storage.HiCacheFile
    saved = cls.batch_get, cls.batch_exists
    try:
        pool = KVPool(4, 4, 1, 1, 2, torch.device("cpu"))
        store = cls(str(tmp_path / "store"), 0, 1)
        store.batch_set(["a", "b", "c", "d"], pool, [0, 1, 2, 3])
        assert store.batch_exists(["a", "b", "c", "d"]) == 4
        fault_hooks._patch_storage(storage, fault_hooks.FaultClock([parse_fault("storage-partial:duration_s=60"),
                                                                    parse_fault("storage-error:start_s=60")], 0))
        assert store.batch_exists(["a", "b", "c", "d"]) == 2 and store.batch_get(["a"], pool, [0]) == 1
        fault_hooks._patch_storage(storage, fault_hooks.FaultClock([parse_fault("storage-timeout:ms=50")], 0))
        t = time.monotonic()
        assert store.batch_get(["a"], pool, [0]) == 0 and time.monotonic() - t >= 0.05
    finally:
        cls.batch_get, cls.batch_exists = saved


def test_skewed_clock_only_moves_forward(clock):
    clock.write_text(repr(time.time() - 10.0))
    c = fault_hooks.FaultClock([], 0)
    shim = fault_hooks.SkewedTime(c, [parse_fault("clock-jump:ms=5000,start_s=2"),
                                      parse_fault("clock-skew:ms=100,start_s=0,duration_s=4")])
    assert shim.offset() == pytest.approx(5.0 + 0.4, abs=0.01)
    assert shim.monotonic() - time.monotonic() == pytest.approx(5.4, abs=0.05)
    assert shim.sleep is time.sleep  # everything else is the real module


def test_wall_clock_and_page_faults_share_the_hooks(clock, monkeypatch):
    """streams.wall_clock() (the repro catalogue's clock) reads the same skewed clock
    as the cache's timeout checks; page-count kinds reach the keys the engine reads."""
    from engine import streams
    clock.write_text(repr(time.time() - 10.0))
    c = fault_hooks.FaultClock([], 0)
    monkeypatch.setattr(streams, "clock", fault_hooks.SkewedTime(c, [parse_fault("clock-skew:rank=1,ms=100")]))
    assert streams.wall_clock() - time.time() == pytest.approx(1.0, abs=0.05)
    faults = [parse_fault("host-pool-shrink:rank=1,pages=2"), parse_fault("storage-miss:pages=3"),
              parse_fault("clock-jitter:ms=20")]
    assert [f.spec() for f in faults] == ["host-pool-shrink:rank=1,pages=2", "storage-miss:pages=3",
                                          "clock-jitter:ms=20"]
    live = fault_hooks.LiveDelays(fault_hooks.FaultClock(faults, rank=1), {})
    assert (live.get("host_pool_shrink"), live.get("storage_miss"), live.get("clock_jitter")) == (2, 3, 20)
    with pytest.raises(ValueError, match="needs pages=N"):
        parse_fault("storage-miss:rank=1")
