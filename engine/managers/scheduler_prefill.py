"""SGLang: srt/managers/scheduler.py (get_new_batch_prefill) with srt/managers/schedule_policy.py.

Prefill admission: the waiting queue, new requests joining it, and the choice
of the next prefill batch. Budgets are rank-local free counts (as in SGLang),
so after the admission loop every rank agrees on how many of the identically
ordered candidates run (`TickCollectives.agree_admitted`), before anything is
allocated. The prefetch vote variants are here because where the vote sits
relative to this loop is the whole of SGLang #30760:
per-poll votes inside the loop (whose exit is rank-local), bulk (#33029) before
it, per-tick inside `check_hicache_events`.
"""

from __future__ import annotations

from engine import streams
from engine.managers.collectives import TickCollectives
from engine.managers.io_struct import ErrorOutput, TokenizedGenerateReqInput
from engine.managers.schedule_batch import Req
from engine.managers.schedule_policy import AddReqResult, PrefillAdder
from engine.mem_cache.base_prefix_cache import BasePrefixCache
from engine.mem_cache.memory_pool import PagedAllocator, ReqToTokenPool
from engine.server_args import ServerArgs


class PrefillManager:
    def __init__(
        self,
        args: ServerArgs,
        tree_cache: BasePrefixCache,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: PagedAllocator,
        sync: TickCollectives,
    ):
        self.args, self.tree_cache, self.sync = args, tree_cache, sync
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.waiting_queue: list[Req] = []
        # SGLang's enable_hicache_storage: only a storage tier has prefetches to wait for.
        self.enable_hicache_storage = (
            args.enable_hierarchical_cache
            and args.hicache_storage_backend is not None
            and not args.decode_radix_disabled
        )
        self.admission_trimmed = 0  # ticks this rank admitted more than its peers

    def add_request(self, msg: TokenizedGenerateReqInput) -> ErrorOutput | None:
        """Defence in depth behind the frontend: a bad request must never kill a rank."""
        error = msg.verify(self.args.model.vocab_size, self.args.max_context_len)
        if error:
            return ErrorOutput(msg.rid, 400, error)
        limit = self.args.max_queued_requests  # SGLang's _abort_on_queued_limit: the queue is replicated
        if limit and len(self.waiting_queue) >= limit:
            return ErrorOutput(msg.rid, 503, "The request queue is full.")
        req = Req.from_input(msg)
        req.wait_start = streams.wall_clock()
        self.waiting_queue.append(req)
        self.tree_cache.prefetch_kvcache(req.rid, req.input_ids[:-1])
        return None

    def requeue_front(self, reqs: list[Req]) -> None:
        self.waiting_queue = reqs + self.waiting_queue

    def get_new_batch_prefill(self, num_running: int, reserved_decode_tokens: int) -> list[Req] | None:
        if not self.waiting_queue:
            return None
        num_allocatable_reqs = min(
            self.args.max_running_requests - num_running, self.req_to_token_pool.available_size()
        )
        if num_allocatable_reqs <= 0:
            return None
        vote = self.args.variants.prefetch_vote
        if self.enable_hicache_storage and vote == "bulk":
            self.tree_cache.check_prefetch_progress_bulk([r.rid for r in self.waiting_queue])
        adder = PrefillAdder(
            self.args.page_size,
            self.token_to_kv_pool_allocator.available_size()
            + self.tree_cache.evictable_size()
            - reserved_decode_tokens,
            self.args.max_prefill_tokens,
        )
        for req in self.waiting_queue:
            if len(adder.can_run_list) >= num_allocatable_reqs:
                break  # batch_is_full
            if self.enable_hicache_storage:
                if vote == "per-poll":  # a vote inside this loop, whose exit is rank-local (SGLang #30760)
                    ready = self.tree_cache.check_prefetch_progress(req.rid)
                else:
                    ready = self.tree_cache.prefetch_ready(req.rid)
                if not ready:
                    continue
            device, host, unlocked = self.tree_cache.peek_prefix(req.fill_ids[:-1])
            res = adder.add_one_req(req, len(req.fill_ids) - device - host, host, req.remaining_tokens, unlocked)
            if res == AddReqResult.NO_TOKEN:
                break  # batch_is_full
        admitted = self.sync.agree_admitted(len(adder.can_run_list))
        batch = adder.can_run_list[:admitted]
        self.admission_trimmed += len(adder.can_run_list) > len(batch)
        if not batch:
            return None
        chosen = {id(r) for r in batch}
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in chosen]
        return batch
