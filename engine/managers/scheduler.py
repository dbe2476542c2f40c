"""The scheduler loop every TP rank runs in lockstep (SGLang's shape).

Per tick: `recv_requests` (rank 0 reads the frontend, then broadcasts over the
TP CPU group) -> `process_input_requests` -> `get_new_batch_prefill`
(`check_hicache_events`, admission with a `PrefillAdder`, agreement on the
batch) -> prefill or one decode step -> results back to the frontend.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from engine.server_args import ServerArgs
from engine.mem_cache.hiradix_cache import HiRadixCache
from engine.mem_cache.memory_pool import KVPool, PagedAllocator, ReqToTokenPool
from engine.model_executor.model import ForwardItem, TinyTransformer
from engine.mem_cache.radix_cache import RadixCache, TreeNode
from engine.managers.schedule_policy import AddReqResult, PrefillAdder, ceil_pages
from engine.mem_cache.hicache_storage import HiCacheFile, StorageIO


@dataclass
class Req:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    ignore_eos: bool = False
    output_ids: list[int] = field(default_factory=list)
    req_pool_idx: int | None = None
    pages: list[int] = field(default_factory=list)  # L1 pages of positions [0, kv_len)
    tree_pages: int = 0             # leading pages owned by the tree (locked via last_node)
    last_node: TreeNode | None = None
    kv_len: int = 0
    cached: dict | None = None      # cached_tokens_details at first admission
    generator: torch.Generator | None = None
    finished: bool = False

    @property
    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output_ids


def validate_request(msg: dict, args: ServerArgs) -> str | None:
    """Defence in depth behind the frontend: a bad request must never kill a rank."""
    ids, sp = msg.get("input_ids"), msg.get("sampling_params") or {}
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        return "input_ids must be a non-empty list of integers"
    if min(ids) < 0 or max(ids) >= args.model.vocab_size:
        return f"token ids must be in [0, {args.model.vocab_size})"
    n = sp.get("max_new_tokens", 16)
    if not isinstance(n, int) or n < 0:
        return "max_new_tokens must be a non-negative integer"
    if len(ids) + n > args.max_context_len:
        return f"prompt_tokens + max_new_tokens exceeds {args.max_context_len}"
    return None


class Scheduler:
    def __init__(self, args: ServerArgs, tp_rank: int, tp_size: int, tp_cpu_group, io_group, device: torch.device,
                 recv_from_frontend: Callable[[float], list[dict]] | None = None,
                 send_to_frontend: Callable[[dict], None] | None = None, model_group=None):
        self.args, self.tp_rank, self.tp_size, self.device = args, tp_rank, tp_size, device
        self.tp_cpu_group = tp_cpu_group
        self.recv_from_frontend, self.send_to_frontend = recv_from_frontend, send_to_frontend
        cfg, p = args.model, args.page_size
        self.page_size = p
        self.model = TinyTransformer(cfg, tp_rank, tp_size, device, group=model_group)
        heads = cfg.num_heads // tp_size
        num_pages = args.max_total_tokens // p
        self.req_to_token_pool = ReqToTokenPool(args.max_running_requests, num_pages * p, device)
        self.token_to_kv_pool_allocator = PagedAllocator(num_pages, p, "device")
        self.kv_pool = KVPool(num_pages, p, cfg.num_layers, heads, cfg.head_dim, device)
        self.storage_io = None
        if args.enable_hierarchical_cache:
            host_pages = self._host_pages(num_pages)
            host_pool = KVPool(host_pages, p, cfg.num_layers, heads, cfg.head_dim, torch.device("cpu"),
                               pin_memory=device.type == "cuda")
            if args.hicache_storage_backend == "file":
                directory = args.hicache_storage_dir or os.path.join(args.run_dir or ".", "storage")
                self.storage_io = StorageIO(HiCacheFile(directory, tp_rank, tp_size), host_pool, io_group, p)
            self.tree_cache: RadixCache = HiRadixCache(
                args, self.token_to_kv_pool_allocator, self.kv_pool, host_pool,
                PagedAllocator(host_pages, p, "host"), tp_cpu_group, device, self.storage_io)
        else:
            self.tree_cache = RadixCache(p, self.token_to_kv_pool_allocator, disable=args.disable_radix_cache)
        self.hicache = isinstance(self.tree_cache, HiRadixCache)
        self.waiting_queue: list[Req] = []
        self.running: list[Req] = []
        self.outputs: list[dict] = []
        self.counters: dict = {"cached_tokens": {"device": 0, "host": 0, "storage": 0},
                               "prompt_tokens": 0, "generation_tokens": 0, "requests": 0}
        self.check_integrity_each_tick = os.environ.get("HCTOOL_CHECK_INTEGRITY") == "1"
        self.did_work = True
        self.ticks = 0
        self.last_metrics: dict | None = None
        self.last_status = time.monotonic()
        self.admission_trimmed = 0  # ticks this rank admitted more than its peers

    def _host_pages(self, device_pages: int) -> int:
        if self.args.hicache_size > 0:
            return max(1, int(self.args.hicache_size * 1e9) // self.kv_pool.page_bytes())
        return int(device_pages * self.args.hicache_ratio)

    # -- tick ----------------------------------------------------------------------------
    def event_loop(self) -> None:
        while True:
            msgs = self.recv_requests()
            if not self.process_input_requests(msgs):
                return
            self.run_tick()

    def recv_requests(self) -> list[dict]:
        msgs: list[dict] = []
        if self.tp_rank == 0 and self.recv_from_frontend is not None:
            idle = not self.waiting_queue and not self.running
            msgs = self.recv_from_frontend(0.05 if idle else (0.0 if self.did_work else 0.005))
        if self.tp_size > 1:
            box = [msgs]
            dist.broadcast_object_list(box, src=0, group=self.tp_cpu_group)
            msgs = box[0]
        return msgs

    def process_input_requests(self, msgs: list[dict]) -> bool:
        """Returns False on shutdown. Every rank sees the same messages in order."""
        for msg in msgs:
            kind = msg.get("type")
            if kind == "shutdown":
                return False
            if kind == "flush_cache":
                self._flush_cache(msg)
            elif kind == "generate":
                self._add_request(msg)
        return True

    def run_tick(self) -> None:
        self.ticks += 1
        batch = self.get_new_batch_prefill()
        ran_prefill = bool(batch) and self.run_prefill(batch)
        if not ran_prefill and self.running:
            self.run_decode()  # also when no admitted request could get L1 pages
        self.did_work = ran_prefill or bool(self.running)
        if self.check_integrity_each_tick:
            self.check_integrity()
        self._flush_outputs()
        if time.monotonic() - self.last_status > 5.0:
            self.log_status()

    def log_status(self) -> None:
        """A one-line state summary in the rank's log, every few seconds."""
        self.last_status = time.monotonic()
        t = self.tree_cache
        prefetching = len(t.ongoing_prefetch) if self.hicache else 0
        print(f"[rank {self.tp_rank}] tick {self.ticks}: waiting {len(self.waiting_queue)} running {len(self.running)} "
              f"prefetching {prefetching} L1 free {self.token_to_kv_pool_allocator.available_size()} "
              f"(logical {self.token_to_kv_pool_allocator.logical_available_size()}) evictable {t.evictable_size()} "
              f"admission trimmed {self.admission_trimmed}x",
              file=sys.stderr, flush=True)

    # -- requests ----------------------------------------------------------------------
    def _add_request(self, msg: dict) -> None:
        error = validate_request(msg, self.args)
        if error:
            self.outputs.append({"type": "error", "rid": msg.get("rid"), "status": 400, "message": error})
            return
        sp = msg.get("sampling_params") or {}
        req = Req(msg["rid"], list(msg["input_ids"]), sp.get("max_new_tokens", 16),
                  float(sp.get("temperature", 0.0) or 0.0), bool(sp.get("ignore_eos", False)))
        if req.temperature > 0:
            seed = sp.get("seed", int.from_bytes(req.rid.encode()[:8].ljust(8, b"\0"), "little") & 0x7FFFFFFF)
            req.generator = torch.Generator().manual_seed(int(seed))
        self.waiting_queue.append(req)
        if self.hicache and self.storage_io is not None:
            m = self.tree_cache.match_prefix(req.input_ids[:-1])
            matched = len(m.device_pages) * self.page_size + m.host_hit_length
            self.tree_cache.prefetch_from_storage(req.rid, req.input_ids[:-1], m.last_host_node, matched)

    # -- prefill -------------------------------------------------------------------------
    def get_new_batch_prefill(self) -> list[Req] | None:
        if self.hicache:
            self.tree_cache.check_hicache_events()
        if not self.waiting_queue:
            return None
        num_allocatable_reqs = min(self.args.max_running_requests - len(self.running),
                                   self.req_to_token_pool.available_size())
        if num_allocatable_reqs <= 0:
            return None
        storage = self.storage_io is not None
        if storage and self.args.prefetch_vote == "bulk":
            self.tree_cache.check_prefetch_progress_bulk([r.rid for r in self.waiting_queue])
        adder = PrefillAdder(self.page_size,
                             self.token_to_kv_pool_allocator.available_size() + self.tree_cache.evictable_size()
                             - self._reserved_decode_tokens(),
                             self.args.max_prefill_tokens)
        for req in self.waiting_queue:
            if len(adder.can_run_list) >= num_allocatable_reqs:
                break  # batch_is_full
            if storage:
                if self.args.prefetch_vote == "per-poll":
                    ready = self.tree_cache.check_prefetch_progress(req.rid)
                else:
                    ready = self.tree_cache.prefetch_ready(req.rid)
                if not ready:
                    continue
            device, host, unlocked = self.tree_cache.peek_prefix(req.fill_ids[:-1])
            res = adder.add_one_req(req, len(req.fill_ids) - device - host, host,
                                    req.max_new_tokens - len(req.output_ids), unlocked)
            if res == AddReqResult.NO_TOKEN:
                break  # batch_is_full
        # Budgets are rank-local: agree on how many of the (identically ordered)
        # candidates run, before anything is allocated.
        admitted = torch.tensor([len(adder.can_run_list)], dtype=torch.int64)
        if self.tp_size > 1:
            dist.all_reduce(admitted, op=dist.ReduceOp.MIN, group=self.tp_cpu_group)
        batch = adder.can_run_list[: int(admitted.item())]
        self.admission_trimmed += len(adder.can_run_list) > len(batch)
        if not batch:
            return None
        chosen = {id(r) for r in batch}
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in chosen]
        return batch

    def _reserved_decode_tokens(self) -> int:
        p = self.page_size
        return sum(ceil_pages(r.kv_len + r.max_new_tokens - len(r.output_ids), p) * p - len(r.pages) * p
                   for r in self.running)

    def run_prefill(self, batch: list[Req]) -> bool:
        """Returns whether any request of the batch ran (others wait for room)."""
        items, ready, requeue = [], [], []
        for req in batch:
            item = self._prepare_extend(req)
            if item is None:
                requeue.append(req)
            else:
                items.append(item)
                ready.append(req)
        self.waiting_queue = requeue + self.waiting_queue
        if not ready:
            return False
        consumer = self.tree_cache.cache_controller.start_loading() if self.hicache else -1
        wait = None
        if consumer >= 0:
            counter = self.tree_cache.cache_controller.layer_done_counter
            def wait(layer):
                counter.wait_until(consumer, layer)
        logits = self.model.forward(items, self.kv_pool, wait_layer=wait)
        next_ids = self.model.sample(logits, [r.temperature for r in ready], [r.generator for r in ready])
        for req, tok in zip(ready, next_ids):
            req.kv_len = len(req.fill_ids)
            if not req.output_ids:  # a retracted request's prompt was counted already
                self.counters["prompt_tokens"] += len(req.input_ids)
            if not self.args.disable_radix_cache:
                self._cache_unfinished_req(req)
            if req.max_new_tokens == 0:
                self._finish(req)
                continue
            self._append_token(req, tok)
            if not req.finished:
                self.running.append(req)
        return True

    def _prepare_extend(self, req: Req) -> ForwardItem | None:
        """Mutates: tree (match, load-back, locks), allocators, req. None when L1 has no
        room even after eviction (a replicated decision: logical counts)."""
        tree, p = self.tree_cache, self.page_size
        fill = req.fill_ids
        m = tree.match_prefix(fill[:-1])
        prefix_pages, last, host_tokens = list(m.device_pages), m.last_device_node, 0
        if m.host_hit_length:
            loaded = tree.init_load_back(m.last_host_node, ceil_pages(len(fill), p) - len(prefix_pages)
                                         - m.host_hit_length // p)
            if loaded is None:
                return None
            chain, own = loaded
            prefix_pages += [pg for n in chain for pg in n.value]
            last, host_tokens = m.last_host_node, m.host_hit_length
            tree.inc_lock_ref(last)  # the loaded nodes stay until this request ends
        else:
            tree.inc_lock_ref(last)
            own = tree.alloc_pages(ceil_pages(len(fill), p) - len(prefix_pages))
            if own is None:
                tree.dec_lock_ref(last)
                return None
        req.req_pool_idx = self.req_to_token_pool.alloc()
        req.pages, req.tree_pages, req.last_node = prefix_pages + own, len(prefix_pages), last
        self._write_req_to_token(req)
        prefix_len = len(prefix_pages) * p
        if req.cached is None:
            storage = min(tree.prefetched_tokens.pop(req.rid, 0), host_tokens) if self.hicache else 0
            req.cached = {"device": prefix_len - host_tokens, "host": host_tokens - storage, "storage": storage}
            for k, v in req.cached.items():
                self.counters["cached_tokens"][k] += v
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        return ForwardItem(fill[prefix_len:], prefix_len, row[: len(fill)])

    def _write_req_to_token(self, req: Req) -> None:
        slots = self.kv_pool.page_slots(req.pages).to(self.device)
        self.req_to_token_pool.req_to_token[req.req_pool_idx, : len(slots)] = slots

    def _cache_unfinished_req(self, req: Req) -> None:
        """Insert the request's prefilled KV so later requests share it; the request
        then reads the tree's pages (duplicates of them are freed)."""
        tree, p = self.tree_cache, self.page_size
        key = req.fill_ids[: req.kv_len]
        res = tree.insert(key, req.pages)
        self.token_to_kv_pool_allocator.free(res.duplicate_pages)
        m = tree.match_prefix(key)
        aligned = len(m.device_pages)
        req.pages[:aligned] = m.device_pages
        tree.inc_lock_ref(m.last_device_node)
        tree.dec_lock_ref(req.last_node)
        req.last_node, req.tree_pages = m.last_device_node, aligned
        self._write_req_to_token(req)

    # -- decode --------------------------------------------------------------------------
    def run_decode(self) -> None:
        p = self.page_size
        for req in list(reversed(self.running)):
            if req.kv_len // p >= len(req.pages):
                page = self.tree_cache.alloc_pages(1)
                if page is None:
                    self._retract(req)
                    continue
                req.pages.extend(page)
                self._write_req_to_token(req)
        if not self.running:
            return
        rows = self.req_to_token_pool.req_to_token
        items = [ForwardItem([r.output_ids[-1]], r.kv_len, rows[r.req_pool_idx, : r.kv_len + 1]) for r in self.running]
        logits = self.model.forward(items, self.kv_pool)
        next_ids = self.model.sample(logits, [r.temperature for r in self.running], [r.generator for r in self.running])
        for req, tok in zip(list(self.running), next_ids):
            req.kv_len += 1
            self._append_token(req, tok)
        self.running = [r for r in self.running if not r.finished]

    def _retract(self, req: Req) -> None:
        """Mutates: frees the request's own pages and puts it back first in line."""
        self.running.remove(req)
        self.token_to_kv_pool_allocator.free(req.pages[req.tree_pages:])
        self.tree_cache.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.pages, req.tree_pages, req.last_node, req.kv_len, req.req_pool_idx = [], 0, None, 0, None
        self.waiting_queue.insert(0, req)

    def _append_token(self, req: Req, tok: int) -> None:
        req.output_ids.append(tok)
        self.counters["generation_tokens"] += 1
        eos = tok == self.args.model.eos_token_id and not req.ignore_eos
        if eos or len(req.output_ids) >= req.max_new_tokens:
            self._finish(req)

    def _finish(self, req: Req) -> None:
        """Mutates: tree (insert), allocator, req pool; queues the result."""
        tree, p = self.tree_cache, self.page_size
        key = req.fill_ids[: req.kv_len]
        aligned = req.kv_len // p
        res = tree.insert(key, req.pages)
        self.token_to_kv_pool_allocator.free(res.duplicate_pages + req.pages[max(aligned, req.tree_pages):])
        tree.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.finished = True
        self.counters["requests"] += 1
        cached = req.cached or {"device": 0, "host": 0, "storage": 0}
        self.outputs.append({"type": "result", "rid": req.rid, "output_ids": list(req.output_ids), "meta_info": {
            "prompt_tokens": len(req.input_ids), "completion_tokens": len(req.output_ids),
            "cached_tokens": sum(cached.values()), "cached_tokens_details": dict(cached)}})

    # -- admin -------------------------------------------------------------------------------
    def _flush_cache(self, msg: dict) -> None:
        if self.waiting_queue or self.running:
            self.outputs.append({"type": "flush_done", "id": msg.get("id"), "ok": False,
                                 "message": "requests are in flight"})
            return
        if self.hicache:
            self.tree_cache.flush()
        else:
            for n in self.tree_cache.nodes():
                self.token_to_kv_pool_allocator.free(n.value)
            self.tree_cache.reset()
        self.outputs.append({"type": "flush_done", "id": msg.get("id"), "ok": True, "message": "flushed"})

    def pages_in_use(self) -> int:
        return sum(len(r.pages) - r.tree_pages for r in self.running)

    def check_integrity(self) -> None:
        self.tree_cache.check_integrity(self.pages_in_use())

    def metrics(self) -> dict:
        t = self.tree_cache
        c = self.counters
        out = {"hicache_cached_tokens_total": dict(c["cached_tokens"]),
               "hicache_evicted_tokens_total": t.evicted_tokens_total,
               "prompt_tokens_total": c["prompt_tokens"], "generation_tokens_total": c["generation_tokens"],
               "requests_total": c["requests"],
               "hicache_load_back_tokens_total": 0, "hicache_backup_tokens_total": 0,
               "hicache_prefetched_tokens_total": 0}
        if self.hicache:
            out.update(hicache_load_back_tokens_total=t.load_back_tokens_total,
                       hicache_backup_tokens_total=t.backup_tokens_total,
                       hicache_prefetched_tokens_total=t.prefetched_tokens_total)
        return out

    def _flush_outputs(self) -> None:
        """Rank 0 sends results, then the metrics when they changed."""
        if self.send_to_frontend is None or self.tp_rank != 0:
            return
        for out in self.outputs:
            self.send_to_frontend(out)
        self.outputs = []
        metrics = self.metrics()
        if metrics != self.last_metrics:
            self.last_metrics = metrics
            self.send_to_frontend({"type": "metrics", "counters": metrics})

    def close(self) -> None:
        if self.hicache:
            self.tree_cache.cache_controller.close()
        if self.storage_io is not None:
            self.storage_io.close()
