"""SGLang: srt/managers/scheduler.py.

The tick loop every TP rank runs in lockstep, in the order of `event_loop`:
recv (rank 0 reads the frontend, every rank gets the broadcast) -> agree (the
cache's per-tick agreement on copy / IO completions) -> schedule (prefill
admission, agreed by MIN) -> run (a prefill batch, else one decode step) ->
output. The parts live in managers: SchedulerIO, PrefillManager, DecodeManager,
ReqResources; every collective of the tick is a method of TickCollectives.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import torch

from engine import streams
from engine.lab.contract import CHECK_INTEGRITY_ENV
from engine.lab.snapshot import TickSnapshot, check_accounting, status_line, take_snapshot, tick_observers
from engine.managers.collectives import TickCollectives
from engine.managers.io_struct import (
    AbortReq,
    ErrorOutput,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GenerateReqOutput,
    MetricsOutput,
    ShutdownReq,
    TokenizedGenerateReqInput,
)
from engine.managers.schedule_batch import Req
from engine.managers.scheduler_decode import DecodeManager
from engine.managers.scheduler_io import DataParallelRouter, SchedulerIO
from engine.managers.scheduler_prefill import PrefillManager
from engine.managers.scheduler_resources import ReqResources, TokenCounters
from engine.managers.state_digest import StateDigest
from engine.mem_cache.cache_factory import create_tree_cache
from engine.mem_cache.hiradix_cache import StateDiverged
from engine.model_executor.model_runner import ModelRunner
from engine.server_args import ServerArgs

STATUS_EVERY_S = 5.0  # a one-line state summary in the rank's log


class Scheduler:
    def __init__(
        self,
        args: ServerArgs,
        tp_rank: int,
        tp_size: int,
        tp_cpu_group,
        io_group,
        device: torch.device,
        recv_from_frontend: Callable[[float], list] | None = None,
        send_to_frontend: Callable[[object], None] | None = None,
        model_group=None,
        parallel=None,
    ):
        """parallel: the rank's ParallelState (engine/distributed/parallel_state.py) when the
        job has pipeline stages or data-parallel replicas; tp_* are then the stage's or the
        replica's own TP ranks and groups."""
        self.args, self.tp_rank, self.tp_size, self.tp_cpu_group = args, tp_rank, tp_size, tp_cpu_group
        self.parallel = parallel
        self.pp_size = parallel.pp_size if parallel is not None else 1
        self.dp_size = parallel.dp_size if parallel is not None else 1
        if self.pp_size > 1:  # every stage must admit the batch the others admit: agree over all
            self.sync = TickCollectives(parallel.world_cpu_group, args.world_size, parallel)
        else:
            self.sync = TickCollectives(tp_cpu_group, tp_size, parallel)
        self.model_runner = ModelRunner(args, tp_rank, tp_size, device, group=model_group, parallel=parallel)
        r = self.model_runner
        self.tree_cache = create_tree_cache(
            args, r.token_to_kv_pool_allocator, r.kv_pool, tp_cpu_group, io_group, tp_rank, tp_size, device, parallel
        )
        self.counters = TokenCounters()
        self.resources = ReqResources(r, self.tree_cache, args.page_size, self.counters)
        rank = parallel.rank if parallel is not None else tp_rank  # the one that talks to the frontend: 0
        self.io = SchedulerIO(rank, self.sync, recv_from_frontend, send_to_frontend)
        if self.dp_size > 1:
            self.io.dp_gather, self.io.dp_leader = True, parallel.tp_rank == 0
            self.io.router = DataParallelRouter(self.dp_size) if rank == 0 else None
        self.prefill = PrefillManager(
            args, self.tree_cache, r.req_to_token_pool, r.token_to_kv_pool_allocator, self.sync
        )
        self.decode = DecodeManager(r, self.resources)
        # PD (SGLang's disaggregation mixins): a prefill server pushes KV, a decode server receives it.
        self.disagg_prefill = self.disagg_decode = None
        if args.disaggregation_mode == "prefill":
            from engine.disaggregation.prefill import PrefillBootstrap

            self.disagg_prefill = PrefillBootstrap(args, tp_rank, tp_size, r)
        elif args.disaggregation_mode == "decode":
            from engine.disaggregation.decode import DecodeQueues

            self.disagg_decode = DecodeQueues(self)
        self.state_digest = StateDigest(args.run_dir, tp_rank) if args.state_digest else None
        self.aborting: set[str] = set()  # rank 0: rids whose abort it has sent
        self.check_integrity_each_tick = os.environ.get(CHECK_INTEGRITY_ENV) == "1"
        self.did_work = True
        self.ticks = 0
        self.last_status = time.monotonic()
        self.snapshot: TickSnapshot | None = None  # this tick's, when observe_tick took one

    # -- the tick ----------------------------------------------------------------------
    def event_loop(self) -> None:
        while True:
            idle = not self.prefill.waiting_queue and not self.decode.running and not self.disagg_decode
            msgs = self.io.recv_requests(idle, self.did_work)  # recv (broadcast)
            if not self.process_input_requests(msgs):
                return
            self.ticks += 1
            self.abort_on_waiting_timeout()
            self.observe_tick()  # the snapshot, if anyone looks
            self.check_hicache_events()  # agree (cache events)
            if self.disagg_decode is not None:
                self.disagg_decode.process_decode_queue()  # PD: prealloc, agreed poll
            batch = self.prefill.get_new_batch_prefill(  # schedule
                len(self.decode.running), self.resources.reserved_decode_tokens(self.decode.running)
            )
            busy = self.dp_size == 1 or self.sync.dp_has_unfinished(
                bool(batch or self.decode.running or self.prefill.waiting_queue)
            )
            forwards = self.model_runner.forward_count
            ran_prefill = bool(batch) and self.run_prefill(batch)  # run
            if not ran_prefill and self.decode.running:
                self.run_decode()  # also when no admitted request could get L1 pages
            if busy and self.dp_size > 1 and self.model_runner.forward_count == forwards:
                self.run_idle_batch()  # DP: another replica has work this step
            self.did_work = ran_prefill or bool(self.decode.running)
            self.io.flush(self.metrics)  # output

    def process_input_requests(self, msgs: list) -> bool:
        """Returns False on shutdown. Every rank sees the same messages in order."""
        for msg in msgs:
            if isinstance(msg, ShutdownReq):
                return False
            if isinstance(msg, AbortReq):
                self.abort_request(msg)
            elif isinstance(msg, FlushCacheReqInput):
                self.io.send(self.flush_cache(msg))
            elif isinstance(msg, TokenizedGenerateReqInput):
                if self.dp_size > 1 and msg.data_parallel_rank != self.parallel.dp_rank:
                    continue  # another replica's request
                add = self.disagg_decode.add_request if self.disagg_decode is not None else self.prefill.add_request
                error = add(msg)
                if error is not None:
                    self.io.send(error)
        return True

    def abort_on_waiting_timeout(self) -> None:
        """SGLang's _abort_on_waiting_timeout (--req-waiting-timeout). local, SGLang
        #27221: each rank reads its own clock and drops requests from its waiting queue
        now; a request near the deadline is dropped on one rank a tick before another,
        and the ranks admit different batches. rank0 (#27164): rank 0 decides and sends
        the rids with the next tick's broadcast, so every rank drops them in one tick."""
        limit, local = self.args.req_waiting_timeout, self.args.variants.waiting_timeout_decision == "local"
        if limit <= 0 or not (local or self.io.tp_rank == 0):  # rank 0 of the whole job decides
            return
        now = streams.wall_clock()
        for req in [r for r in self.prefill.waiting_queue if now - r.wait_start > limit and r.rid not in self.aborting]:
            message = f"waited longer than --req-waiting-timeout {limit:g} s"
            if local:
                self.abort_request(AbortReq(req.rid, message))
            else:
                self.aborting.add(req.rid)
                self.io.decisions.append(AbortReq(req.rid, message))

    def abort_request(self, msg: AbortReq) -> None:
        """SGLang's abort_request. Mutates: drops the request wherever it is, waiting (it holds no
        pages) or running (its KV goes to the tree, as a finished request's does), and answers
        msg.status. Every rank gets the AbortReq in the same tick's broadcast, so every rank drops
        it here in that tick. A rid no longer here (it just finished) is nothing to do."""
        rid = msg.rid
        self.aborting.discard(rid)
        found = [r for r in self.prefill.waiting_queue if r.rid == rid]
        self.prefill.waiting_queue = [r for r in self.prefill.waiting_queue if r.rid != rid]
        if self.disagg_decode is not None:  # PD decode: only a request that holds nothing yet
            found += [dr.req for dr in self.disagg_decode.prealloc_queue if dr.req.rid == rid]
            self.disagg_decode.prealloc_queue = [dr for dr in self.disagg_decode.prealloc_queue if dr.req.rid != rid]
        for req in [r for r in self.decode.running if r.rid == rid]:
            self.resources.cache_finished_req(req)
            req.finished = True
            found.append(req)
        self.decode.filter_finished()
        if found:
            self.io.send(ErrorOutput(rid, msg.status, msg.message))

    def observe_tick(self) -> None:
        """Take this tick's snapshot (engine/lab/snapshot.py) when something reads it: the state
        digest, the integrity check, the status line every few seconds, added observers."""
        observers = tick_observers()
        status_due = time.monotonic() - self.last_status > STATUS_EVERY_S
        if not (observers or status_due or self.state_digest or self.check_integrity_each_tick):
            self.snapshot = None
            return
        self.snapshot = snap = take_snapshot(self)
        if self.check_integrity_each_tick:
            check_accounting(snap)
        if status_due:
            self.last_status = time.monotonic()
            print(status_line(snap), file=sys.stderr, flush=True)
        for observe in observers:
            observe(snap)

    def check_hicache_events(self) -> None:
        if self.state_digest is None:
            self.tree_cache.check_hicache_events()
            return
        d = self.state_digest.digest(self.snapshot.replicated)
        try:
            self.tree_cache.check_hicache_events(d)
        except StateDiverged as exc:  # every rank is here in the same tick
            path = self.state_digest.dump(self.ticks)
            raise StateDiverged(f"{exc} at tick {self.ticks}; this rank's state record: {path}") from None

    # -- run -----------------------------------------------------------------------------
    def run_prefill(self, batch: list[Req]) -> bool:
        """Returns whether any request of the batch ran (others wait for room)."""
        items, ready, requeue = [], [], []
        for req in batch:
            item = self.resources.prepare_extend(req)
            if item is None:
                requeue.append(req)
            else:
                items.append(item)
                ready.append(req)
        self.prefill.requeue_front(requeue)
        if not ready:
            return False
        next_ids = self.model_runner.forward(items, ready, wait_layer=self.tree_cache.ready_to_load_host_cache())
        for req, tok in zip(ready, next_ids):
            req.kv_len = len(req.fill_ids)
            if not req.output_ids:  # a retracted request's prompt was counted already
                self.counters.prompt_tokens += len(req.input_ids)
            if not self.args.disable_radix_cache:
                self.resources.cache_unfinished_req(req)
            if self.disagg_prefill is not None and req.bootstrap_room is not None:
                self.disagg_prefill.send_kv(req, tok)  # decode continues from here
                req.output_ids.append(tok)
                self.counters.generation_tokens += 1
                self.finish(req)
                continue
            if req.max_new_tokens == 0:
                self.finish(req)
                continue
            self.append_token(req, tok)
            if not req.finished:
                self.decode.running.append(req)
        return True

    def run_idle_batch(self) -> None:
        """DP: this replica runs no tokens this step while another does. SGLang's DP attention
        runs an idle batch, vLLM a dummy run: either way every collective of the step, with no
        rows of its own (--dp-idle-step idle). skip is vLLM before #28774: a step with zero
        scheduled tokens returns early, and its peers' coordinate_batch_across_dp pairs with
        whatever this replica calls next."""
        if self.args.variants.dp_idle_step == "skip":
            return
        self.model_runner.forward_idle()

    def run_decode(self) -> None:
        self.prefill.requeue_front(self.decode.update_running_batch())
        if not self.decode.running:
            return
        running = list(self.decode.running)
        next_ids = self.model_runner.forward(self.decode.decode_items(), running)
        for req, tok in zip(running, next_ids):
            req.kv_len += 1
            self.append_token(req, tok)
        self.decode.filter_finished()

    # -- output ----------------------------------------------------------------------------
    def append_token(self, req: Req, tok: int) -> None:
        req.output_ids.append(tok)
        self.counters.generation_tokens += 1
        eos = tok == self.args.model.eos_token_id and not req.sampling_params.ignore_eos
        if eos or len(req.output_ids) >= req.max_new_tokens:
            self.finish(req)

    def finish(self, req: Req) -> None:
        output_ids = list(req.output_ids)
        self.resources.cache_finished_req(req)
        req.finished = True
        self.counters.requests += 1
        cached = req.cached or {"device": 0, "host": 0, "storage": 0}
        self.io.send(
            GenerateReqOutput(
                req.rid,
                output_ids,
                {
                    "prompt_tokens": len(req.input_ids),
                    "completion_tokens": len(req.output_ids),
                    "cached_tokens": sum(cached.values()),
                    "cached_tokens_details": dict(cached),
                },
            )
        )

    def metrics(self) -> MetricsOutput:
        t, c = self.tree_cache, self.counters
        return MetricsOutput(
            {
                "hicache_cached_tokens_total": dict(c.cached_tokens),
                "hicache_evicted_tokens_total": t.evicted_tokens_total,
                "prompt_tokens_total": c.prompt_tokens,
                "generation_tokens_total": c.generation_tokens,
                "requests_total": c.requests,
                "hicache_load_back_tokens_total": t.load_back_tokens_total,
                "hicache_backup_tokens_total": t.backup_tokens_total,
                "hicache_prefetched_tokens_total": t.prefetched_tokens_total,
                "hicache_storage_corrupt_pages_total": t.storage_corrupt_pages,
                "hicache_storage_writes_enabled": int(t.storage_writes_enabled),
            }
        )

    # -- admin -------------------------------------------------------------------------------
    def flush_cache(self, msg: FlushCacheReqInput) -> FlushCacheReqOutput:
        if self.prefill.waiting_queue or self.decode.running:
            return FlushCacheReqOutput(msg.id, False, "requests are in flight")
        self.tree_cache.flush()
        return FlushCacheReqOutput(msg.id, True, "flushed")

    def check_integrity(self) -> None:
        check_accounting(take_snapshot(self))

    def close(self) -> None:
        self.tree_cache.close()
        for part in (self.disagg_prefill, self.disagg_decode):
            if part is not None:
                part.close()
