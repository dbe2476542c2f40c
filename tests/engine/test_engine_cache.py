"""The cache tiers, in-process at TP=1 (a real gloo world of one):

- KV bytes round-trip exactly L1 -> L2 -> L1 and L1 -> L3 -> L2 -> L1 through the
  HiRadixCache / HiCacheController / StorageIO APIs the scheduler uses;
- radix tree unit tests (insert, match, split, LRU eviction by logical clock, lock refs)
  and a hypothesis property: random insert/match/lock/evict sequences keep
  check_integrity true and every matched page holds exactly its prefix's KV.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.lab.variants import Variants
from engine.mem_cache.hicache_storage import HiCacheFile, StorageIO
from engine.mem_cache.hiradix_cache import HiRadixCache
from engine.mem_cache.memory_pool import KVPool, PagedAllocator
from engine.mem_cache.radix_cache import RadixCache, chain_hashes
from engine.server_args import ServerArgs
from hctool.supervise.procs import free_port

CPU = torch.device("cpu")
PAGE = 16
DEADLINE_S = 60.0


# --- a gloo world of one ---------------------------------------------------------------
@pytest.fixture(scope="module")
def groups():
    created = not dist.is_initialized()
    if created:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield dist.new_group(backend="gloo"), dist.new_group(backend="gloo")
    if created:
        dist.destroy_process_group()


class Tiers:
    """One rank's L1/L2(/L3) stack built the way engine.mem_cache.cache_factory builds it."""

    def __init__(
        self,
        groups,
        device_pages=16,
        host_pages=64,
        storage_dir: Path | None = None,
        write_policy="write_through",
        vote="per-tick",
        prefetch_policy="wait_complete",
        device=CPU,
    ):
        self.args = ServerArgs(
            page_size=PAGE,
            max_total_tokens=device_pages * PAGE,
            enable_hierarchical_cache=True,
            hicache_ratio=host_pages / device_pages,
            hicache_write_policy=write_policy,
            hicache_storage_backend="file" if storage_dir else None,
            hicache_storage_dir=str(storage_dir) if storage_dir else None,
            hicache_storage_prefetch_policy=prefetch_policy,
            variants=Variants(prefetch_vote=vote),
            prefetch_threshold=PAGE,
        )
        cfg = self.args.model
        self.device_pool = KVPool(device_pages, PAGE, cfg.num_layers, cfg.num_heads, cfg.head_dim, device)
        self.host_pool = KVPool(
            host_pages, PAGE, cfg.num_layers, cfg.num_heads, cfg.head_dim, CPU, pin_memory=device.type == "cuda"
        )
        self.storage_io = (
            StorageIO(HiCacheFile(str(storage_dir), 0, 1), self.host_pool, groups[1], PAGE) if storage_dir else None
        )
        self.tree = HiRadixCache(
            self.args,
            PagedAllocator(device_pages, PAGE, "device"),
            self.device_pool,
            self.host_pool,
            PagedAllocator(host_pages, PAGE, "host"),
            groups[0],
            device,
            self.storage_io,
        )
        self.ctrl = self.tree.cache_controller

    def check(self):
        self.tree.check_integrity(0)

    def fill(self, key: list[int], seed: int) -> torch.Tensor:
        """Allocate device pages for key, write random KV into them, insert them into the
        tree (applying the write policy); returns the KV written, [2, layers, tokens, h, d]."""
        pages = self.tree.alloc_pages(len(key) // PAGE)
        g = torch.Generator().manual_seed(seed)
        slots = self.device_pool.page_slots(pages).to(self.device_pool.k_buffer.device)
        for buf in (self.device_pool.k_buffer, self.device_pool.v_buffer):
            buf[:, slots] = torch.randn(buf[:, slots].shape, generator=g).to(buf.device)
        res = self.tree.insert(key, pages)
        self.tree.allocator.free(res.duplicate_pages)
        self.check()
        return kv_of(self.device_pool, self.tree.match_prefix(key).device_pages)

    def settle(self):
        """Tick check_hicache_events until every copy, storage backup and prefetch is acked."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            self.tree.check_hicache_events()
            self.check()
            busy = (
                self.ctrl.ack_write_queue
                or self.ctrl.ack_load_queue
                or self.tree.ongoing_prefetch
                or (self.storage_io and self.storage_io.ack_backup_queue)
            )
            if not busy:
                return
            assert time.monotonic() < deadline, "copies/backups did not complete in time"
            time.sleep(0.01)

    def load_back(self, key: list[int]) -> list[int]:
        """Load the host-only part of key's prefix to the device; returns key's device pages."""
        m = self.tree.match_prefix(key)
        assert m.host_hit_length > 0
        assert self.tree.init_load_back(m.last_host_node) is not None, "load-back found no room"
        slot = self.ctrl.start_loading()
        assert slot >= 0
        for layer in range(self.device_pool.num_layers):
            self.ctrl.layer_done_counter.wait_until(slot, layer)
        self.settle()
        m = self.tree.match_prefix(key)
        assert m.host_hit_length == 0 and len(m.device_pages) * PAGE == len(key)
        return m.device_pages

    def scribble_free_device_pages(self):
        """Overwrite every free device page, so a load-back that copies nothing is caught."""
        self.tree.allocator._collect()
        slots = self.device_pool.page_slots(list(self.tree.allocator.free_pages)).to(self.device_pool.k_buffer.device)
        self.device_pool.k_buffer[:, slots] = -7.0
        self.device_pool.v_buffer[:, slots] = -7.0

    def close(self):
        self.ctrl.close()
        if self.storage_io:
            self.storage_io.close()


def kv_of(pool: KVPool, pages: list[int]) -> torch.Tensor:
    slots = pool.page_slots(pages).to(pool.k_buffer.device)
    return torch.stack([pool.k_buffer[:, slots], pool.v_buffer[:, slots]]).cpu()


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(1, 30000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture
def tiers(groups, request):
    made = []

    def make(**kw):
        t = Tiers(groups, **kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


# --- L1 -> L2 -> L1 ----------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_kv_roundtrip_device_host_device(tiers, policy, device=CPU):
    t = tiers(write_policy=policy, device=device)
    shared, tail = tokens(64, 1), tokens(64, 2)
    key = shared + tail
    want = t.fill(key, seed=10)
    t.settle()
    if policy == "write_through":
        for node in _path(t.tree, key):
            assert node.backuped
            assert torch.equal(kv_of(t.host_pool, node.host_value), kv_of(t.device_pool, node.value))
    # Keep the shared prefix on the device (a second request locks it), evict the rest.
    other = t.fill(shared + tokens(32, 3), seed=11)
    t.settle()
    holder = t.tree.match_prefix(shared).last_device_node
    t.tree.inc_lock_ref(holder)
    evicted = t.tree.evict(10**6)
    t.check()
    assert evicted >= len(tail) and t.tree.evicted_tokens_total == evicted
    t.settle()  # write_back: the D2H copy started by the eviction is acked here
    m = t.tree.match_prefix(key)
    assert len(m.device_pages) * PAGE == len(shared) and m.host_hit_length == len(tail)
    t.scribble_free_device_pages()
    pages = t.load_back(key)
    t.check()
    assert torch.equal(kv_of(t.device_pool, pages), want), "KV changed on its way L1 -> L2 -> L1"
    assert t.tree.load_back_tokens_total == len(tail)
    t.tree.dec_lock_ref(holder)
    t.check()
    assert torch.equal(kv_of(t.device_pool, t.tree.match_prefix(shared).device_pages), other[:, :, : len(shared)])


def _path(tree, key):
    node, rest, out = tree.root, tuple(key), []
    while rest:
        child = node.children.get(rest[:PAGE])
        if child is None:
            break
        out.append(child)
        node, rest = child, rest[len(child.key) :]
    return out


def test_write_through_selective_backs_up_on_second_hit(tiers):
    t = tiers(write_policy="write_through_selective")
    key = tokens(64, 4)
    t.fill(key, seed=12)
    t.settle()
    assert not any(n.backuped for n in _path(t.tree, key)), "backed up on the first hit"
    t.fill(key, seed=13)  # the same prefix computed again: its 2nd hit
    t.settle()
    assert all(n.backuped for n in _path(t.tree, key)), "not backed up on the second hit"


def test_host_eviction_drops_lru_host_leaves(tiers):
    t = tiers(device_pages=8, host_pages=12)
    keys = [tokens(64, 20 + i) for i in range(4)]  # 4 pages each; the host holds 3 of them
    for i, k in enumerate(keys):
        t.fill(k, seed=i)
        t.settle()
        t.tree.evict(10**6)
        t.settle()
    t.check()
    assert t.tree.match_prefix(keys[0]).host_hit_length == 0, "the oldest host copy should be gone"
    assert t.tree.match_prefix(keys[3]).host_hit_length == 64


# --- L1 -> L3 -> L2 -> L1 ----------------------------------------------------------------
@pytest.mark.parametrize("vote", ["per-tick", "bulk", "per-poll"])
def test_kv_roundtrip_through_storage(tiers, tmp_path, vote, device=CPU):
    store = tmp_path / "store"
    first = tiers(storage_dir=store, device=device)
    key = tokens(128, 5)
    want = first.fill(key, seed=14)
    first.settle()  # write ack -> storage backup -> backup ack
    hashes = chain_hashes("", key, PAGE)
    files = sorted(p.name for p in store.iterdir())
    assert files == sorted(f"{h}_tp1_0.bin" for h in hashes)

    # A fresh rank: empty L1 and L2, the same storage directory.
    second = tiers(storage_dir=store, vote=vote, device=device)
    tree = second.tree
    assert tree.match_prefix(key).host_hit_length == 0
    tree.prefetch_from_storage("r1", key, tree.root, 0)
    op = tree.ongoing_prefetch["r1"]
    assert op.done.wait(DEADLINE_S), "prefetch thread did not finish"
    second.check()
    if vote == "per-tick":
        tree.check_hicache_events()
    elif vote == "bulk":
        tree.check_prefetch_progress_bulk(["r1"])
    else:
        assert tree.check_prefetch_progress("r1")
    assert "r1" not in tree.ongoing_prefetch
    assert tree.prefetched_tokens["r1"] == len(key) == tree.prefetched_tokens_total
    second.check()
    m = tree.match_prefix(key)
    assert m.device_pages == [] and m.host_hit_length == len(key)
    host_pages = [p for n in _path(tree, key) for p in n.host_value]
    assert torch.equal(kv_of(second.host_pool, host_pages), want), "KV changed on its way L1 -> L3 -> L2"
    second.scribble_free_device_pages()
    pages = second.load_back(key)
    assert torch.equal(kv_of(second.device_pool, pages), want), "KV changed on its way L1 -> L3 -> L2 -> L1"
    second.check()


def test_storage_miss_for_other_tp_layout(tiers, tmp_path):
    """Keys are suffixed with the TP rank: a TP=1 page is no hit for another layout."""
    store = tmp_path / "store"
    first = tiers(storage_dir=store)
    key = tokens(64, 6)
    first.fill(key, seed=15)
    first.settle()
    assert HiCacheFile(str(store), 0, 2).batch_exists(chain_hashes("", key, PAGE)) == 0
    assert HiCacheFile(str(store), 0, 1).batch_exists(chain_hashes("", key, PAGE)) == 4


# --- radix tree unit tests --------------------------------------------------------------------
P2 = 2


def radix(pages=32):
    return RadixCache(P2, PagedAllocator(pages, P2, "device"))


def put(tree, key):
    pages = tree.alloc_pages(len(key) // P2)
    res = tree.insert(key, pages)
    tree.allocator.free(res.duplicate_pages)
    return pages, res


def test_radix_insert_match_split():
    tree = radix()
    pages, _ = put(tree, (1, 2, 3, 4, 5, 6, 7))  # unaligned tail token ignored
    assert len(pages) == 3
    m = tree.match_prefix((1, 2, 3, 4, 9, 9))
    assert m.device_pages == pages[:2]
    top = tree.root.children[(1, 2)]
    assert top.key == (1, 2, 3, 4) and list(top.children.values())[0].key == (5, 6)  # split at the match
    _, res = put(tree, (1, 2, 3, 4, 8, 8))
    assert len(res.duplicate_pages) == 2 and len(res.new_nodes) == 1
    assert tree.match_prefix((1, 2, 3, 4, 8, 8)).device_pages[:2] == pages[:2]
    assert tree.match_prefix((7, 7)).device_pages == []
    tree.check_integrity(0)


def test_radix_evicts_lru_by_logical_clock():
    tree = radix()
    a, b, c = (1, 1, 1, 1), (2, 2, 2, 2), (3, 3, 3, 3)
    for k in (a, b, c):
        put(tree, k)
    tree.match_prefix(a)  # a is now the most recently used
    assert tree.evict(4) == 4
    assert tree.match_prefix(b).device_pages == [], "b was least recently used"
    assert len(tree.match_prefix(a).device_pages) == 2 and len(tree.match_prefix(c).device_pages) == 2
    tree.check_integrity(0)


def test_radix_lock_refs_protect_nodes():
    tree = radix()
    put(tree, (1, 1, 2, 2))
    put(tree, (1, 1, 3, 3))
    node = tree.match_prefix((1, 1, 2, 2)).last_device_node
    tree.inc_lock_ref(node)
    assert tree.protected_size() == 4 and tree.evictable_size() == 2
    tree.evict(100)
    assert len(tree.match_prefix((1, 1, 2, 2)).device_pages) == 2  # locked path survives
    assert len(tree.match_prefix((1, 1, 3, 3)).device_pages) == 1  # unlocked leaf went
    tree.dec_lock_ref(node)
    with pytest.raises(AssertionError, match="underflow"):
        tree.dec_lock_ref(node)


def test_check_integrity_detects_a_leak():
    tree = radix()
    put(tree, (1, 1, 2, 2))
    tree.allocator.alloc(1)  # a page nobody accounts for
    with pytest.raises(AssertionError, match="L1 leak"):
        tree.check_integrity(0)
    tree.check_integrity(1)


OPS = st.one_of(
    st.tuples(st.just("insert"), st.lists(st.integers(1, 3), max_size=12)),
    st.tuples(st.just("lock"), st.lists(st.integers(1, 3), max_size=12)),
    st.tuples(st.just("unlock"), st.integers(0, 100)),
    st.tuples(st.just("evict"), st.integers(1, 16)),
)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=40))
def test_radix_property_random_ops_keep_integrity(ops):
    tree = radix(pages=12)
    owner: dict[int, tuple] = {}  # page -> the prefix whose last page's KV it holds
    locks = []
    for op, arg in ops:
        if op == "insert":
            key = tuple(arg)
            n = len(key) // P2
            pages = tree.alloc_pages(n) if n else []
            if pages is None:
                continue  # everything is locked: a caller would wait
            res = tree.insert(key, pages)
            dup = set(res.duplicate_pages)
            tree.allocator.free(res.duplicate_pages)
            for i, pg in enumerate(pages):
                if pg not in dup:
                    owner[pg] = key[: (i + 1) * P2]
        elif op == "lock":
            m = tree.match_prefix(tuple(arg))
            for i, pg in enumerate(m.device_pages):
                assert owner[pg] == tuple(arg[: (i + 1) * P2]), "a matched page holds another prefix's KV"
            tree.inc_lock_ref(m.last_device_node)
            locks.append(m.last_device_node)
        elif op == "unlock" and locks:
            tree.dec_lock_ref(locks.pop(arg % len(locks)))
        elif op == "evict":
            tree.evict(arg)
        tree.check_integrity(0)
        assert tree.evictable_size() + tree.protected_size() == tree.device_pages_in_tree() * P2
        for node in locks:  # locked nodes stay on the device and in the tree
            n = node
            while n is not tree.root:
                assert not n.evicted and n.parent.children.get(n.key[:P2]) is n
                n = n.parent
