"""In-rank faults on real engine parts (streams, allocator, file store) and on this process's
clocks: each fault acts only inside its window, with its probability, on its rank."""

from __future__ import annotations

import time

import pytest
import torch

from engine.lab.seams import SEAMS
from hctool.agent import faults as agent_faults
from hctool.agent import names
from hctool.agent.clock import REAL
from hctool.protocol.faults import parse_fault


@pytest.fixture
def clock(tmp_path, monkeypatch):
    monkeypatch.setenv("HCTOOL_FAULTS_T0", str(tmp_path / "t0"))
    return tmp_path / "t0"


@pytest.fixture
def real_time():
    """The agent patches the time module process-wide: restore it after each test."""
    saved = {
        k: getattr(time, k)
        for k in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "sleep")
    }
    yield
    for k, v in saved.items():
        setattr(time, k, v)
    SEAMS.reset()


def _seams(faults, rank=0):
    """Install faults as a rank does, after undoing the previous install's wrappers."""
    from engine.mem_cache.hicache_storage import HiCacheFile

    for name in ("batch_get", "batch_exists"):
        fn = HiCacheFile.__dict__[name]
        setattr(HiCacheFile, name, getattr(fn, "__hctool_original__", fn))
    names.reset()
    SEAMS.reset()
    c = agent_faults.FaultClock(faults, rank)
    agent_faults.install_with(c, faults)
    return c


def test_clock_reads_zero_until_the_workload_starts(clock):
    c = agent_faults.FaultClock([parse_fault("free-delay:ms=5,start_s=1")], rank=0)
    assert c.now() == 0.0 and c.firing(("free-delay",)) == []
    clock.write_text(repr(time.time() - 2.0))
    time.sleep(0.15)
    assert c.now() >= 2.0 and [f.kind for f in c.firing(("free-delay",))] == ["free-delay"]


def test_nothing_fires_after_the_heal(clock):
    clock.write_text(repr(time.time() - 5.0))
    c = agent_faults.FaultClock([parse_fault("free-delay:ms=300")], rank=0)
    assert c.firing(("free-delay",))
    clock.write_text(f"{time.time() - 5.0!r} 4.0")  # healed one second ago
    time.sleep(0.15)
    assert c.firing(("free-delay",)) == [] and c.heal == 4.0


def test_seam_delays_follow_windows_and_probability(clock, real_time):
    clock.write_text(repr(time.time()))
    _seams(
        [
            parse_fault("free-delay:ms=300,duration_s=60"),
            parse_fault("h2d-sleep:ms=7,start_s=60"),
            parse_fault("d2h-sleep:ms=10,p=0.5"),
        ],
        rank=1,
    )
    assert SEAMS.free_delay_ms() == 300 and SEAMS.copy_delay_ms("h2d") == 0.0
    draws = [SEAMS.copy_delay_ms("d2h") for _ in range(400)]
    assert set(draws) == {0.0, 10.0} and 120 < draws.count(10.0) < 280


def test_free_delay_defers_real_frees(clock, real_time):
    from engine.mem_cache import memory_pool

    clock.write_text(repr(time.time()))
    _seams([parse_fault("free-delay:ms=200")])
    alloc = memory_pool.PagedAllocator(8, 16, "device")
    alloc.free(alloc.alloc(4))
    assert alloc.available_size() == 4 * 16 and alloc.logical_available_size() == 8 * 16
    time.sleep(0.25)
    assert alloc.available_size() == 8 * 16


def test_storage_faults_on_a_real_file_store(clock, tmp_path, real_time):
    """The engine's StorageIO sees what faults make its store answer: half the pages
    (storage-partial), a miss for a failed read (storage-error), a read that waits and then
    fails (storage-timeout)."""
    from engine.mem_cache import hicache_storage as storage
    from engine.mem_cache.memory_pool import KVPool

    clock.write_text(repr(time.time()))
    cls = storage.HiCacheFile
    saved = cls.batch_get, cls.batch_exists
    pool = KVPool(4, 4, 1, 1, 2, torch.device("cpu"))
    store = cls(str(tmp_path / "store"), 0, 1)
    store.batch_set(["a", "b", "c", "d"], pool, [0, 1, 2, 3])
    io = storage.StorageIO.__new__(storage.StorageIO)  # its read path alone, without threads or a group
    io.backend, io.read_errors = store, 0
    try:
        assert io._exists(["a", "b", "c", "d"]) == 4
        _seams([parse_fault("storage-partial:duration_s=60"), parse_fault("storage-error:start_s=60")])
        assert SEAMS.storage_exists(io._exists(["a", "b", "c", "d"])) == 2 and io._get(["a"], pool, [0]) == 1
        _seams([parse_fault("storage-error:p=1")])
        assert io._get(["a"], pool, [0]) == 0 and io._exists(["a"]) == 0 and io.read_errors == 2
        _seams([parse_fault("storage-timeout:ms=50")])
        t = time.monotonic()
        assert io._get(["a"], pool, [0]) == 0 and time.monotonic() - t >= 0.05
    finally:
        cls.batch_get, cls.batch_exists = saved
        names.reset()


def test_skewed_clock_only_moves_forward(clock, real_time):
    clock.write_text(repr(time.time() - 10.0))
    faults = [parse_fault("clock-jump:ms=5000,start_s=2"), parse_fault("clock-skew:ms=100,start_s=0,duration_s=4")]
    agent_faults.install_with(agent_faults.FaultClock(faults, 0), faults)
    assert time.monotonic() - REAL.monotonic() == pytest.approx(5.4, abs=0.05)
    assert time.perf_counter() - REAL.perf_counter() == pytest.approx(5.4, abs=0.05)
    assert time.time() - REAL.time() == pytest.approx(5.4, abs=0.05)
    assert time.sleep is REAL.sleep  # everything else is the real module


def test_wall_clock_and_page_faults_share_the_hooks(clock, real_time):
    """streams.wall_clock() (the repro catalogue's clock) and PrefetchOperation.start_time
    read the same skewed clock as the cache's timeout checks; page-count kinds reach the
    seams the engine reads."""
    from engine import streams
    from engine.mem_cache.hicache_storage import PrefetchOperation

    clock.write_text(repr(time.time() - 10.0))
    faults = [parse_fault("clock-skew:rank=1,ms=100")]
    agent_faults.install_with(agent_faults.FaultClock(faults, 1), faults)
    assert streams.wall_clock() - REAL.time() == pytest.approx(1.0, abs=0.05)
    assert PrefetchOperation("r", None, (), [], []).start_time - REAL.monotonic() == pytest.approx(1.0, abs=0.05)
    faults = [
        parse_fault("host-pool-shrink:rank=1,pages=2"),
        parse_fault("storage-miss:pages=3"),
        parse_fault("clock-jitter:ms=20"),
    ]
    assert [f.spec() for f in faults] == [
        "host-pool-shrink:rank=1,pages=2",
        "storage-miss:pages=3",
        "clock-jitter:ms=20",
    ]
    _seams(faults, rank=1)
    assert (SEAMS.host_pool_pages(10), SEAMS.storage_exists(10)) == (8, 7)
    with pytest.raises(ValueError, match="needs pages=N"):
        parse_fault("storage-miss:rank=1")


@pytest.fixture
def restored():
    """thread-slow and io-delay patch the process's queue, Event, sleep and open(): undo them."""
    import builtins
    import io
    import queue
    import threading

    saved = (queue.Queue.get, threading.Event.wait, time.sleep, builtins.open, io.open)
    yield
    queue.Queue.get, threading.Event.wait, time.sleep, builtins.open, io.open = saved


def test_thread_slow_holds_non_main_threads_only(clock, restored):
    import queue
    import threading

    clock.write_text(repr(time.time()))
    faults = [parse_fault("thread-slow:ms=150,thread=worker-*")]
    agent_faults.install_with(agent_faults.FaultClock(faults, 0), faults)
    q = queue.Queue()
    took = {}

    def worker(name):
        t = time.monotonic()
        q.get(timeout=5)
        took[name] = time.monotonic() - t

    threads = [threading.Thread(target=worker, args=(n,), name=n) for n in ("worker-1", "other")]
    for t in threads:
        t.start()
    q.put(1), q.put(2)
    for t in threads:
        t.join(5)
    t = time.monotonic()
    q.put(3)
    q.get()  # the main thread is never held
    assert took["worker-1"] >= 0.15 > took["other"] and time.monotonic() - t < 0.1


def test_io_delay_slows_reads_and_writes_of_matching_paths(clock, tmp_path, restored):
    clock.write_text(repr(time.time()))
    faults = [parse_fault(f"io-delay:path={tmp_path}/slow*,ms=60")]
    agent_faults.install_with(agent_faults.FaultClock(faults, 0), faults)
    fast, slow = tmp_path / "fast.txt", tmp_path / "slow.txt"
    t = time.monotonic()
    fast.write_text("x")
    assert fast.read_text() == "x" and time.monotonic() - t < 0.06
    t = time.monotonic()
    slow.write_text("y")  # pathlib goes through io.open
    with open(slow) as f:
        assert f.read() == "y"
    assert time.monotonic() - t >= 0.12
