"""SGLang: srt/mem_cache/hiradix_cache.py.

HiRadixCache: the radix cache with an L2 host tier and an optional L3 store.

Tree mutations must be identical on every rank while their triggers (copy
events, IO threads, clocks) are rank-local, so each trigger is turned into a
number every rank agrees on with a collective on the TP CPU group
(`check_hicache_events`, the prefetch votes) before the tree changes. These
collectives stay here, where SGLang has them, so a trace names the same
function (`_vote_prefetch`) as an SGLang trace; docs/architecture.md lists
them with the scheduler's (`TickCollectives`).
"""

from __future__ import annotations

import hashlib
import heapq
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist

from engine.managers.cache_controller import HiCacheController
from engine.managers.pp_sync import StageSync, catch_up
from engine.mem_cache.hicache_storage import BackupOperation, PrefetchOperation, StorageIO
from engine.mem_cache.memory_pool import KVPool, PagedAllocator
from engine.mem_cache.radix_cache import RadixCache, TreeNode, chain_hashes
from engine.server_args import ServerArgs

NO_BOUND = 2**62  # a neutral MIN contribution


class TickAgreement(NamedTuple):
    """What check_hicache_events MIN-reduces once per tick, by name. A MIN of -x is -MAX(x),
    so [d, -d] pairs test that every rank holds the same d."""

    write_acks: int  # ready write acks (packed mode; per-queue modes agree them before)
    load_acks: int
    backups: int  # finished storage backups
    prefetch_digest: int  # of the live prefetch set (per-tick vote), else 0
    neg_prefetch_digest: int
    state_digest: int  # --state-digest, else 0
    neg_state_digest: int
    io_ok: int  # 1: this rank's storage IO threads are healthy
    writes_ok: int  # 1: its storage writes have not failed
    neg_corrupt_pages: int  # -(damaged L3 pages it found)

    def pack(self, skip_acks: bool) -> torch.Tensor:
        """The tensor to MIN-reduce (without the ack counts when they were agreed already)."""
        return torch.tensor(list(self[2:] if skip_acks else self), dtype=torch.int64)

    def unpack(self, reduced: torch.Tensor, skip_acks: bool) -> TickAgreement:
        out = [int(x) for x in reduced.tolist()]
        return TickAgreement(*(list(self[:2]) + out if skip_acks else out))


class StateDiverged(RuntimeError):
    """--state-digest: the replicated state differs across ranks (raised on every rank)."""


class HiRadixCache(RadixCache):
    def __init__(
        self,
        args: ServerArgs,
        allocator: PagedAllocator,
        device_pool: KVPool,
        host_pool: KVPool,
        host_allocator: PagedAllocator,
        tp_cpu_group,
        device: torch.device,
        storage_io: StorageIO | None = None,
        pp_sync: StageSync | None = None,
    ):
        self.host_allocator = host_allocator
        super().__init__(args.page_size, allocator, lru_clock=args.variants.lru_clock)
        self.args = args
        self.tp_cpu_group = tp_cpu_group
        self.pp_sync = pp_sync  # PP: how the agreements reach across stages (engine/managers/pp_sync.py)
        self.cache_controller = HiCacheController(device_pool, host_pool, device)
        self.write_policy = args.hicache_write_policy
        self.prefetch_vote = args.variants.prefetch_vote
        self.storage_io = storage_io
        self.storage_writes_enabled = storage_io is not None
        self.prefetched_tokens: dict[str, int] = {}  # rid -> tokens its prefetch inserted
        self.ack_check = args.variants.hicache_ack_check
        self._bulk_ready: dict[str, bool] = {}  # bulk: this tick's agreed verdicts

    # -- host tier ------------------------------------------------------------------
    def inc_host_ref(self, node: TreeNode) -> None:
        """Mutates: host_ref of node and ancestors (their host pages stay put)."""
        self._add_ref(node, "host_ref", 1)

    def dec_host_ref(self, node: TreeNode) -> None:
        self._add_ref(node, "host_ref", -1)

    def alloc_host(self, num_pages: int) -> list[int] | None:
        """Mutates: host allocator, and the tree when host leaves must be dropped."""
        short = num_pages * self.page_size - self.host_allocator.logical_available_size()
        if short > 0:
            self.evict_host(short)
        return self.host_allocator.alloc(num_pages)

    def evict_host(self, num_tokens: int) -> int:
        """Mutates: drops least recently used host-only leaves (L2 -> gone)."""

        def droppable(n: TreeNode) -> bool:
            return n.evicted and n.backuped and not n.children and n.host_ref == 0 and n is not self.root

        heap = [n for n in self.nodes() if droppable(n)]
        heapq.heapify(heap)
        dropped = 0
        while dropped < num_tokens and heap:
            node = heapq.heappop(heap)
            self.host_allocator.free(node.host_value)
            self._delete(node)
            dropped += len(node.key)
            if droppable(node.parent):
                heapq.heappush(heap, node.parent)
        return dropped

    def write_backup(self, node: TreeNode) -> bool:
        """Mutates: node (host pages, writing) and the D2H stream. The copy is
        submitted at once so a later eviction can defer its free on the event."""
        if node.backuped or node.writing or node.evicted:
            return True
        if self.write_policy != "write_back" and not _has_host_copy(node.parent):
            # Written-through nodes form a prefix from the root (SGLang's invariant):
            # a node without a host copy above host-only children can never be
            # evicted, yet evictable_size() counts it (the bulk stall, issue #12).
            return False
        host_pages = self.alloc_host(len(node.value))
        if host_pages is None:
            return False
        node.host_value, node.writing = host_pages, True
        self.cache_controller.write(node.value, host_pages, node)
        node.write_event = self.cache_controller.start_writing()
        return True

    def insert(self, key, pages: list[int]):
        """The radix insert, then the write policy: write_through backs up every node
        that just got device KV; write_through_selective backs up nodes on the path on
        their 2nd hit (SGLang); write_back waits for eviction."""
        res = super().insert(key, pages)
        if self.write_policy == "write_through":
            # Every node on the path, top down: a backup that failed on a full host
            # pool is retried on the next hit (SGLang's _inc_hit_count), parents first.
            node, rest = self.root, self._aligned(key)
            while rest:
                child = node.children.get(rest[: self.page_size])
                if child is None or child.evicted or not self.write_backup(child):
                    break
                node, rest = child, rest[len(child.key) :]
        elif self.write_policy == "write_through_selective":
            node, rest = self.root, self._aligned(key)
            while rest:
                child = node.children.get(rest[: self.page_size])
                if child is None:
                    break
                if child.hit_count >= 2:
                    self.write_backup(child)
                node, rest = child, rest[len(child.key) :]
        return res

    def _evict_device(self, node: TreeNode) -> int:
        if not node.backuped and not node.writing and self.write_policy == "write_back":
            self.write_backup(node)
        if node.backuped or node.writing:
            # Device pages still being read by the D2H copy are freed when it ends:
            # the tree changes now on every rank, the free count lags per rank.
            self.allocator.free(node.value, after=None if node.backuped else node.write_event)
            node.value = None
            return len(node.key)
        if node.children or node.host_ref:
            return 0
        self.allocator.free(node.value)
        self._delete(node)
        return len(node.key)

    # -- load-back (L2 -> L1) ---------------------------------------------------------
    def init_load_back(self, last_host_node: TreeNode, extra_pages: int = 0) -> tuple[list[TreeNode], list[int]] | None:
        """Mutates: gives every evicted node from last_host_node up to the first device
        ancestor new device pages and queues their H2D copy; also allocates
        `extra_pages` for the caller in the same step, so nothing is half done when
        L1 is full (then: None, and nothing changed)."""
        chain = []
        node = last_host_node
        while node.evicted:
            chain.append(node)
            node = node.parent
        chain.reverse()
        # Keep the device ancestor and the host chain while evicting for room.
        self.inc_lock_ref(node)
        self.inc_host_ref(last_host_node)  # released by the load ack
        load_pages = sum(len(n.host_value) for n in chain)
        pages = self.alloc_pages(load_pages + extra_pages)
        self.dec_lock_ref(node)
        if pages is None or not chain:
            self.dec_host_ref(last_host_node)
            return None if pages is None else ([], pages)
        at = 0
        for n in chain:
            n.value, at = pages[at : at + len(n.host_value)], at + len(n.host_value)
            self.load_back_tokens_total += len(n.key)
        self.cache_controller.load([p for n in chain for p in n.host_value], pages[:load_pages], last_host_node)
        return chain, pages[load_pages:]

    def should_load_back(self, device_node: TreeNode, pages: int) -> bool:
        """Load a host hit back, or compute it again? logical (the fix, SGLang #33442):
        always try - init_load_back evicts and allocates on the logical free count,
        which every rank shares. local (pre-fix): evict for room (on the logical
        count, so every rank evicts the same nodes), then load back only if the pages
        are free *now* on this rank. Frees behind a copy arrive per rank, so one rank
        loads the prefix back and another computes it again: the forward's sizes differ."""
        if self.args.variants.load_back_capacity == "logical":
            return True
        need = pages * self.page_size
        self.inc_lock_ref(device_node)  # the matched device prefix must survive the eviction
        short = need - self.allocator.logical_available_size()
        if short > 0:
            self.evict(short)
        self.dec_lock_ref(device_node)
        return self.allocator.available_size() >= need

    def ready_to_load_host_cache(self) -> Callable[[int], None] | None:
        consumer = self.cache_controller.start_loading()
        if consumer < 0:
            return None
        counter = self.cache_controller.layer_done_counter
        return lambda layer: counter.wait_until(consumer, layer)

    # -- PD decode local restore (engine/disaggregation/decode_hicache_mixin.py) ------
    def is_load_back_event_done(self, consumer_index: int) -> bool:
        """Whether the load-back in `consumer_index`'s slot finished on this rank.
        event (pre-fix, SGLang #29483): when it did, enter loading_check() - a TP
        collective on the ranks whose event fired only. slot (the fix): poll the
        local event only; check_hicache_events reaps the acks in lockstep."""
        if consumer_index < 0:
            return True
        events = self.cache_controller.layer_done_counter.events[consumer_index]
        if events is not None and not events[-1].query():
            return False
        if self.args.variants.decode_restore_gate == "event":
            self.loading_check()
        return True

    def has_free_load_back_slot(self) -> bool:
        """Replicated: the ack queue grows in start_loading and shrinks by agreed pops."""
        c = self.cache_controller
        return len(c.ack_load_queue) < c.layer_done_counter.num_counters

    # -- the per-tick agreement -------------------------------------------------------
    def _prefetch_set_digest(self) -> int:
        h = hashlib.blake2b("\0".join(self.ongoing_prefetch).encode(), digest_size=7)
        return int.from_bytes(h.digest(), "little")  # < 2**56, so -d fits int64

    def check_hicache_events(self, state_digest: int = 0) -> None:
        """Once per tick on every rank: one packed MIN all_reduce of the ready counts
        (write acks, load acks, storage backups), of [d, -d] for a digest d of the
        live prefetch set (per-tick vote) and for the scheduler's replicated-state
        digest (--state-digest), of an IO-healthy flag, a storage-writes-ok flag and
        the negated count of damaged L3 pages; then every rank pops the same number
        of acks and turns L3 writes off in the same tick, or every rank raises."""
        c = self.cache_controller
        d = self._prefetch_set_digest() if self.prefetch_vote == "per-tick" else 0
        sd = state_digest
        s = self.storage_io  # its flags and counts are rank-local: agreed below
        writes, loads = c.ready_counts()
        if self.ack_check != "packed":  # SGLang's shape: one MIN per queue, then the rest
            writes, loads = self.writing_check(writes), self.loading_check(loads)
        mine = TickAgreement(
            writes,
            loads,
            s.backup_ready_count() if s else 0,
            d,
            -d,
            sd,
            -sd,
            int(s is None or s.error is None),
            int(s is None or s.write_error is None),
            -(s.backend.corrupt_pages if s else 0),
        )
        skip = self.ack_check != "packed"
        counts = mine.pack(skip)
        if self.pp_sync is None:  # issued here, not in a shared helper: a trace names the agreeing method, as SGLang's
            dist.all_reduce(counts, op=dist.ReduceOp.MIN, group=self.tp_cpu_group)
        else:
            self.pp_sync.all_reduce(counts, dist.ReduceOp.MIN)
        a = mine.unpack(counts, skip)
        writes, loads, backups = a.write_acks, a.load_acks, a.backups
        if not a.io_ok:  # every rank raises in the same tick, none is left in a collective
            raise RuntimeError(f"HiCache storage IO thread failed on some rank (here: {self.storage_io.error!r})")
        if a.state_digest != -a.neg_state_digest:
            raise StateDiverged(f"replicated state differs across ranks (local digest {sd:x})")
        self.storage_corrupt_pages = -a.neg_corrupt_pages
        if not a.writes_ok and self.storage_writes_enabled:  # the same tick on every rank
            self.storage_writes_enabled = False
            print(
                f"[rank {dist.get_rank()}] WARNING: storage writes failed on some rank (here: "
                f"{s.write_error or 'none'}); L3 writes are off, reads go on",
                file=sys.stderr,
                flush=True,
            )
        if a.prefetch_digest != -a.neg_prefetch_digest:
            raise RuntimeError(
                f"HiCache live prefetch set diverged across ranks (local digest {d:x}, "
                f"{len(self.ongoing_prefetch)} prefetches)"
            )
        for ack in c.pop_acks("write", writes):
            self.backup_tokens_total += ack.tokens
            for node in ack.nodes:
                self._finish_write(node, ack.event)
        for ack in c.pop_acks("load", loads):
            for node in ack.nodes:
                self.dec_host_ref(node)
        if self.storage_io is not None:
            for op in self.storage_io.pop_backups(backups):
                self.dec_host_ref(op.node)
        if self.args.variants.prefetch_reap == "local":
            self._reap_completed_prefetches()
        if self.prefetch_vote == "per-tick" and self.ongoing_prefetch:
            self._vote_all_prefetches()

    def writing_check(self, ready: int) -> int:
        """MIN of the ready write acks (hicache_ack_check per-queue / skip-empty).
        skip-empty, SGLang before #26923/#27489: "all ranks have the same
        ongoing_write_through, can skip sync if empty" - but a rank whose host
        allocation failed has queued nothing, returns here, and its peers enter the
        all_reduce alone."""
        if self.ack_check == "skip-empty" and not self.cache_controller.ack_write_queue:
            return 0
        return self._min(ready)

    def loading_check(self, ready: int | None = None) -> int:
        """MIN of the ready load acks. From check_hicache_events (per-queue, skip-empty)
        it returns the agreed count, which the caller pops; skip-empty returns early as
        writing_check does. Called alone (SGLang's shape; only `--decode-restore-gate
        event` does) it counts this rank's ready acks and reaps the agreed number."""
        if ready is not None:
            if self.ack_check == "skip-empty" and not self.cache_controller.ack_load_queue:
                return 0
            return self._min(ready)
        loads = self._min(self.cache_controller.ready_counts()[1])
        for ack in self.cache_controller.pop_acks("load", loads):
            for node in ack.nodes:
                self.dec_host_ref(node)
        return loads

    def _min(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        if self.pp_sync is None:
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.tp_cpu_group)
        else:
            self.pp_sync.all_reduce(t, dist.ReduceOp.MIN)
        return int(t.item())

    def _finish_write(self, node: TreeNode, event) -> None:
        # A node split while its copy ran shares the event with its upper part.
        while node is not None and node.writing and node.write_event is event:
            node.writing, node.backuped, node.write_event = False, True, None
            if self.storage_writes_enabled:
                self.inc_host_ref(node)
                self.storage_io.backup(BackupOperation(node, list(node.hash_value), list(node.host_value)))
            node = node.parent

    # -- storage prefetch (L3 -> L2) --------------------------------------------------
    def prefetch_from_storage(self, rid: str, key, last_host_node: TreeNode, matched: int) -> None:
        """Mutates: host allocator, anchor's host_ref, ongoing_prefetch. Starts fetching
        the pages after the matched prefix when enough of them may be in storage."""
        if self.storage_io is None or rid in self.ongoing_prefetch:
            return
        rest = tuple(key[matched : len(key) - len(key) % self.page_size])
        if len(rest) < max(self.args.prefetch_threshold, self.page_size):
            return
        prev = last_host_node.hash_value[-1] if last_host_node.hash_value else ""
        hashes = chain_hashes(prev, rest, self.page_size)
        self.inc_host_ref(last_host_node)  # the anchor must outlive the prefetch
        host_pages = self.alloc_host(len(hashes))
        if host_pages is None:
            self.dec_host_ref(last_host_node)
            return
        op = PrefetchOperation(rid, last_host_node, rest, hashes, host_pages)
        self.ongoing_prefetch[rid] = op
        self.storage_io.prefetch(op)

    def prefetch_kvcache(self, rid: str, key) -> None:
        """Mutates: as match_prefix, then prefetch_from_storage (with a storage backend)."""
        if self.storage_io is None:
            return
        m = self.match_prefix(key)
        matched = len(m.device_pages) * self.page_size + m.host_hit_length
        self.prefetch_from_storage(rid, key, m.last_host_node, matched)

    def pop_prefetched_tokens(self, rid: str) -> int:
        return self.prefetched_tokens.pop(rid, 0)

    def can_terminate_prefetch(self, op: PrefetchOperation) -> bool:
        """Rank-local: whether this rank may stop waiting for this prefetch."""
        if op.done.is_set():
            return True
        policy = self.args.hicache_storage_prefetch_policy
        if policy == "best_effort":
            return True
        if policy == "wait_complete":
            return False
        a = self.args
        budget = min(
            a.prefetch_timeout_max, a.prefetch_timeout_base + a.prefetch_timeout_per_ki_token * len(op.token_ids) / 1024
        )
        return time.monotonic() - op.start_time >= budget

    def check_prefetch_progress(self, rid: str) -> bool:
        """May request `rid` be admitted? per-poll: votes right here, once per call
        (the shape of SGLang #30760: called per waiting request inside the admission
        loop, whose exit is rank-local). Other variants decided before the loop.
        A rid this rank has no live prefetch for: prefetch_untracked_poll skip returns
        early (SGLang #38268: peers that still track it vote alone); join votes with a
        neutral contribution (nothing to wait for, no bound on the completed count)."""
        op = self.ongoing_prefetch.get(rid)
        if op is None:
            if self.args.variants.prefetch_untracked_poll == "skip":
                return True
            return self._vote_prefetch(None)
        return self._vote_prefetch(op)

    def prefetch_ready(self, rid: str) -> bool:
        """Read-only poll for the bulk and per-tick variants (bulk: this tick's verdict)."""
        if rid in self._bulk_ready:
            return self._bulk_ready[rid]
        return rid not in self.ongoing_prefetch

    def check_prefetch_progress_bulk(self, rids: list[str]) -> None:
        """bulk (SGLang #33029): poll every request of the broadcast waiting queue,
        once per tick, before the admission loop; the loop reads the verdicts."""
        self._bulk_ready = {rid: self.check_prefetch_progress(rid) for rid in rids}

    def _reap_completed_prefetches(self) -> None:
        """prefetch_reap=local (pre-fix): a prefetch whose IO thread has fetched every
        page is finished at once, without a vote - nothing seems left to agree on. But
        "at once" is this rank's IO timing, so for a while the rid is live on a slow
        rank and gone on a fast one."""
        for op in [op for op in self.ongoing_prefetch.values() if op.done.is_set()]:
            self._finish_prefetch(op, op.completed_tokens)

    def _vote_prefetch(self, op: PrefetchOperation | None) -> bool:
        """MAX vote on [not terminable, terminated], then MIN of the completed tokens;
        op None is the neutral contribution of a rank with no live prefetch."""
        mine = [0, 0] if op is None else [int(not self.can_terminate_prefetch(op)), int(op.terminate_flag.is_set())]
        state = torch.tensor(mine, dtype=torch.int64)
        if self.pp_sync is None:
            dist.all_reduce(state, op=dist.ReduceOp.MAX, group=self.tp_cpu_group)
        else:
            self.pp_sync.all_reduce(state, dist.ReduceOp.MAX)
        if int(state[0]) > 0:
            return False
        follows = self.pp_sync is not None and self.pp_sync.follows_stage0
        if op is not None and not follows:
            op.terminate()
        completed = torch.tensor([NO_BOUND if op is None else op.completed_tokens], dtype=torch.int64)
        if self.pp_sync is None:
            dist.all_reduce(completed, op=dist.ReduceOp.MIN, group=self.tp_cpu_group)
        else:
            self.pp_sync.all_reduce(completed, dist.ReduceOp.MIN)
        if op is not None:
            if follows:  # stage 0's count: fetch up to it before stopping
                catch_up(op, int(completed.item()))
                op.terminate()
            self._finish_prefetch(op, int(completed.item()))
        return True

    def _vote_all_prefetches(self) -> None:
        """per-tick: one MAX all_reduce over [not terminable, -completed] of every live
        prefetch in insertion order; -max(-c) is the MIN completed count."""
        ops = list(self.ongoing_prefetch.values())
        snap = [[int(not self.can_terminate_prefetch(op)), -op.completed_tokens] for op in ops]
        votes = torch.tensor(snap, dtype=torch.int64).reshape(-1)
        if self.pp_sync is None:
            dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self.tp_cpu_group)
        else:
            self.pp_sync.all_reduce(votes, dist.ReduceOp.MAX)
        follows = self.pp_sync is not None and self.pp_sync.follows_stage0
        for op, (not_terminable, neg_completed) in zip(ops, votes.view(-1, 2).tolist()):
            if not_terminable == 0:
                if follows:  # stage 0 ended it at its count: this stage fetches up to it first
                    catch_up(op, -neg_completed)
                op.terminate()
                self._finish_prefetch(op, -neg_completed)

    def _finish_prefetch(self, op: PrefetchOperation, completed: int) -> None:
        """Mutates: inserts the agreed number of fetched pages as host-only nodes under
        the anchor, frees the rest, releases the anchor."""
        pages = completed // self.page_size
        dup = self._insert_host(
            op.anchor, op.token_ids[: pages * self.page_size], op.host_pages[:pages], op.hashes[:pages]
        )
        self.host_allocator.free(dup + op.host_pages[pages:])
        self.dec_host_ref(op.anchor)
        del self.ongoing_prefetch[op.rid]
        inserted = pages * self.page_size - len(dup) * self.page_size
        self.prefetched_tokens[op.rid] = inserted
        self.prefetched_tokens_total += inserted

    def _insert_host(self, anchor: TreeNode, tokens, host_pages: list[int], hashes: list[str]) -> list[int]:
        """Mutates: adds host-only nodes below anchor; returns host pages not needed.
        Nothing goes under a node without a host copy (see write_backup)."""
        node, done, p = anchor, 0, self.page_size
        while done < len(tokens):
            if not _has_host_copy(node):
                return list(host_pages)
            rest = tokens[done:]
            child = node.children.get(rest[:p])
            if child is None:
                leaf = TreeNode(node, rest, None, hashes[done // p :])
                leaf.host_value, leaf.backuped, leaf.last_access = host_pages[done // p :], True, self._stamp()
                node.children[rest[:p]] = leaf
                return host_pages[: done // p]
            n = self._common_len(child.key, rest)
            if n < len(child.key):
                child = self._split(child, n)
            node, done = child, done + n
        return list(host_pages)

    # -- lifecycle --------------------------------------------------------------------
    def host_pages_in_use(self) -> int:
        tree = sum(len(n.host_value) for n in self.nodes() if n.host_value is not None)
        return tree + sum(len(op.host_pages) for op in self.ongoing_prefetch.values())

    def flush(self) -> None:
        """Mutates: everything. Callers ensure no request is running or waiting."""
        self.cache_controller.synchronize()
        # Every copy is done on every rank now, so the agreed counts pop everything;
        # write acks may start storage backups, which must finish before pages go.
        self.check_hicache_events()
        if self.storage_io is not None:
            for op in list(self.storage_io.ack_backup_queue):
                if not op.done.wait(120.0):
                    raise RuntimeError("storage backup did not finish")
            self.check_hicache_events()
        for n in self.nodes():
            if not n.evicted:
                self.allocator.free(n.value)
            if n.host_value is not None:
                self.host_allocator.free(n.host_value)
        self.reset()

    def close(self) -> None:
        self.cache_controller.close()
        if self.storage_io is not None:
            self.storage_io.close()


def _has_host_copy(node: TreeNode) -> bool:
    """The root, a backed-up node, or one whose host copy is being written."""
    return node.parent is None or node.backuped or node.writing
