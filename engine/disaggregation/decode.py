"""SGLang: srt/disaggregation/decode.py (DecodePreallocQueue, DecodeTransferQueue).

The decode server's way in: a request arrives (broadcast to every rank like any
other), waits in the prealloc queue until L1 pages and a request slot are
reserved for its prompt, then its receiver registers with the prefill's
bootstrap server and it waits in the transfer queue for its KV. Allocation
reads logical (replicated) counts, so every rank reserves the same pages.

Whether a room's KV has arrived is rank-local (each rank has its own socket), so
the ranks agree with one MIN all_reduce over the decode TP CPU group per tick,
issued every tick, even with an empty queue, over a fixed-shape payload of
`max_running_requests` poll states padded with Success (SGLang's incident of
queue-sized, sometimes-skipped poll collectives is INCIDENTS.md #9). A request
moves on, or fails, on every rank in the same tick.

`--decode-poll queue` keeps the pre-fix shape of #36928 / #21297: a request joins
the transfer queue when this rank's own receiver has bootstrapped (rank-local), and
the poll is sized by the local queue and skipped when it is empty.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.disaggregation.conn import KVPoll, KVReceiverManager
from engine.disaggregation.decode_hicache_mixin import DecodeHiCacheMixin
from engine.managers.io_struct import ErrorOutput, TokenizedGenerateReqInput
from engine.managers.schedule_batch import Req
from engine.managers.schedule_policy import ceil_pages


@dataclass
class DecodeRequest:
    req: Req
    bootstrap_host: str
    bootstrap_port: int
    prefix_len: int = 0  # tokens served by decode's own cache (not copied from the transfer)
    l1_len: int = 0  # of which on device at prealloc
    host_len: int = 0  # of which in decode's L2: restored locally (decode_hicache_mixin)
    last_host_node: object = None  # held (host_ref) from prealloc until the load-back is queued
    restored_node: object = None  # locked from the load-back until the request ends
    restored_pages: list = None
    consumer_index: int = -1
    restore_ready: bool = False


class DecodeQueues(DecodeHiCacheMixin):
    """The prealloc and transfer queues of one decode rank (SGLang keeps them as
    two classes; here they share the receiver and the resources)."""

    def __init__(self, scheduler):
        s = self.scheduler = scheduler
        a = s.args
        self.page_size, self.max_running = a.page_size, a.max_running_requests
        self.receivers = KVReceiverManager(
            a.disaggregation_kv_host, s.tp_rank, s.tp_size, a.model.num_heads, a.disaggregation_transfer_timeout
        )
        self.prealloc_queue: list[DecodeRequest] = []
        self.transfer_queue: list[DecodeRequest] = []
        self.bootstrap_queue: list[DecodeRequest] = []  # --decode-poll queue only
        self.queue_poll = a.variants.decode_poll == "queue"
        self.local_restore = hasattr(s.tree_cache, "is_load_back_event_done")

    def __len__(self) -> int:
        return len(self.prealloc_queue) + len(self.bootstrap_queue) + len(self.transfer_queue)

    def add_request(self, msg: TokenizedGenerateReqInput) -> ErrorOutput | None:
        s = self.scheduler
        error = msg.verify(s.args.model.vocab_size, s.args.max_context_len)
        if error is None and (msg.bootstrap_room is None or msg.bootstrap_host is None or msg.bootstrap_port is None):
            error = "a decode server needs bootstrap_host, bootstrap_port and bootstrap_room (send it via the router)"
        if error:
            return ErrorOutput(msg.rid, 400, error)
        self.prealloc_queue.append(DecodeRequest(Req.from_input(msg), msg.bootstrap_host, msg.bootstrap_port))
        return None

    # -- the tick ---------------------------------------------------------------------
    def process_decode_queue(self) -> None:
        """Every decode rank, every tick: prealloc, then the agreed poll."""
        self.pop_preallocated()
        if self.queue_poll:  # pre-fix: a request moves on when THIS rank's handshake is done
            ready = [
                dr for dr in self.bootstrap_queue if self.receivers.poll(dr.req.bootstrap_room) > KVPoll.Bootstrapping
            ]
            self.bootstrap_queue = [dr for dr in self.bootstrap_queue if dr not in ready]
            self.transfer_queue += ready
        if self.local_restore:
            self._process_hicache_local_restores(self.transfer_queue)
        states = self.poll_and_all_reduce()
        keep = []
        for dr, state in zip(self.transfer_queue, states):
            if state == KVPoll.Success:
                self.commit_transferred(dr)
            elif state == KVPoll.Failed:
                self.abort(dr)
            else:
                keep.append(dr)
        self.transfer_queue = keep

    def pop_preallocated(self) -> None:
        s = self.scheduler
        while self.prealloc_queue:
            if len(s.decode.running) + len(self.transfer_queue) + len(self.bootstrap_queue) >= self.max_running:
                return
            if s.model_runner.req_to_token_pool.available_size() <= 0:
                return
            dr = self.prealloc_queue[0]
            if not self.prealloc(dr):
                return  # no L1 room (a replicated decision): wait for running requests
            self.prealloc_queue.pop(0)
            self.receivers.init(dr.req.bootstrap_room, dr.bootstrap_host, dr.bootstrap_port)
            (self.bootstrap_queue if self.queue_poll else self.transfer_queue).append(dr)

    def prealloc(self, dr: DecodeRequest) -> bool:
        """Mutates: tree (match, lock), allocator, req pool. Reserves the prompt's pages,
        reusing a device prefix of decode's own radix cache when it keeps one."""
        s, req, p = self.scheduler, dr.req, self.page_size
        tree = s.tree_cache
        m = tree.match_prefix(req.input_ids)
        prefix = list(m.device_pages)
        tree.inc_lock_ref(m.last_device_node)
        if m.host_hit_length:
            tree.inc_host_ref(m.last_host_node)  # keep the L2 prefix until its load-back is queued
        own = tree.alloc_pages(ceil_pages(len(req.input_ids), p) - len(prefix) - m.host_hit_length // p)
        if own is None:
            tree.dec_lock_ref(m.last_device_node)
            if m.host_hit_length:
                tree.dec_host_ref(m.last_host_node)
            return False
        if m.host_hit_length:
            dr.host_len, dr.last_host_node = m.host_hit_length, m.last_host_node
        req.req_pool_idx = s.model_runner.req_to_token_pool.alloc()
        req.pages, req.tree_pages, req.last_node = prefix + own, len(prefix), m.last_device_node
        s.model_runner.write_req_to_token(req.req_pool_idx, req.pages)
        dr.l1_len = len(prefix) * p
        dr.prefix_len = dr.l1_len + dr.host_len
        return True

    def poll_and_all_reduce(self) -> list[int]:
        local = [int(self._gate_restore(dr, self.receivers.poll(dr.req.bootstrap_room))) for dr in self.transfer_queue]
        if self.queue_poll:
            return self._poll_queue_sized(local)
        payload = torch.full((self.max_running,), int(KVPoll.Success), dtype=torch.int64)
        payload[: len(local)] = torch.tensor(local, dtype=torch.int64)
        if self.scheduler.tp_size > 1:
            dist.all_reduce(payload, op=dist.ReduceOp.MIN, group=self.scheduler.tp_cpu_group)
        return payload[: len(local)].tolist()

    def _poll_queue_sized(self, local: list[int]) -> list[int]:
        """--decode-poll queue (pre-fix): sized by the local queue, skipped when it is empty."""
        if not local:
            return []
        payload = torch.tensor(local, dtype=torch.int64)
        if self.scheduler.tp_size > 1:
            dist.all_reduce(payload, op=dist.ReduceOp.MIN, group=self.scheduler.tp_cpu_group)
        return payload.tolist()

    def commit_transferred(self, dr: DecodeRequest) -> None:
        """Mutates: L1 (the transferred KV beyond decode's own prefix), req, running."""
        s, req = self.scheduler, dr.req
        room = self.receivers.pop(req.bootstrap_room)
        self._commit_hicache_local_restore_to_req(dr)
        s.model_runner.write_req_to_token(req.req_pool_idx, req.pages)
        n = len(req.input_ids)
        pool = s.model_runner.kv_pool
        slots = s.model_runner.token_slots(req.req_pool_idx, n)[dr.prefix_len :].to(pool.k_buffer.device)
        pool.k_buffer[:, slots] = room.k[:, dr.prefix_len : n].to(pool.k_buffer.device)
        pool.v_buffer[:, slots] = room.v[:, dr.prefix_len : n].to(pool.v_buffer.device)
        req.kv_len = n
        req.cached = {"device": dr.l1_len, "host": dr.host_len, "storage": 0}
        for k, v in req.cached.items():
            s.counters.cached_tokens[k] += v
        s.counters.prompt_tokens += n
        if req.max_new_tokens == 0:
            s.finish(req)
            return
        s.append_token(req, room.first_token)
        if not req.finished:
            s.decode.running.append(req)

    def abort(self, dr: DecodeRequest) -> None:
        s, req = self.scheduler, dr.req
        room = self.receivers.pop(req.bootstrap_room)
        self._abort_hicache_local_restore(dr)
        s.resources.release_retracted(req)
        s.io.send(
            ErrorOutput(req.rid, 502, f"KV transfer for this request failed: {room.error or 'prefill side failed'}")
        )

    def close(self) -> None:
        self.receivers.close()
