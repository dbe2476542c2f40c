"""SGLang: srt/managers/scheduler.py (recv_requests) and scheduler_output_processor_mixin.py.

Request I/O of the tick: rank 0 polls the frontend and every rank receives the
same messages through `TickCollectives.broadcast_reqs`; outputs queue up during
the tick and rank 0 sends them (then the metrics, when they changed) at its end.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.managers.collectives import TickCollectives
from engine.managers.io_struct import FlushCacheReqOutput, MetricsOutput, TokenizedGenerateReqInput


class SchedulerIO:
    def __init__(
        self,
        tp_rank: int,
        sync: TickCollectives,
        recv_from_frontend: Callable[[float], list] | None,
        send_to_frontend: Callable[[object], None] | None,
    ):
        self.tp_rank, self.sync = tp_rank, sync
        self.recv_from_frontend, self.send_to_frontend = recv_from_frontend, send_to_frontend
        self.outputs: list = []
        self.last_metrics: dict | None = None
        self.decisions: list = []  # rank 0's own messages for every rank (AbortReq)
        self.router: DataParallelRouter | None = None  # DP: rank 0 picks each request's replica

    def recv_requests(self, idle: bool, did_work: bool) -> list:
        """Every rank, every tick: the frontend's messages in rank 0's order."""
        msgs: list = []
        if self.tp_rank == 0 and self.recv_from_frontend is not None:
            # Block briefly when idle; spin when the last tick did work.
            msgs = self.recv_from_frontend(0.05 if idle else (0.0 if did_work else 0.005))
        if self.tp_rank == 0 and self.decisions:
            msgs, self.decisions = self.decisions + msgs, []
        if self.router is not None and self.tp_rank == 0:
            self.router.dispatch(msgs)
        return self.sync.broadcast_reqs(msgs)

    def send(self, out) -> None:
        self.outputs.append(out)

    def flush(self, metrics_fn: Callable[[], object]) -> None:
        """Rank 0 sends results, then the metrics when they changed. Under DP each replica's
        first rank hands its outputs and counters to rank 0 first (a gather over the DP group)."""
        if self.dp_gather:
            self.flush_dp(metrics_fn)
            return
        if self.send_to_frontend is None or self.tp_rank != 0:
            self.outputs = []
            return
        for out in self.outputs:
            self.send_to_frontend(out)
        self.outputs = []
        metrics = metrics_fn()
        if metrics.counters != self.last_metrics:
            self.last_metrics = metrics.counters
            self.send_to_frontend(metrics)

    dp_gather = False  # set on every rank under DP
    dp_leader = False  # a replica's first rank: its outputs are the replica's

    def flush_dp(self, metrics_fn: Callable[[], object]) -> None:
        payload = (self.outputs, metrics_fn().counters) if self.dp_leader else ([], {})
        gathered = self.sync.dp_gather_outputs(payload)
        self.outputs = []
        if gathered is None or self.send_to_frontend is None:
            return
        flushes: dict[str, list] = {}
        for outputs, _ in gathered:
            for out in outputs:
                if isinstance(out, FlushCacheReqOutput):  # every replica answers a flush: merge
                    flushes.setdefault(out.id, []).append(out)
                else:
                    self.send_to_frontend(out)
        for answers in flushes.values():
            bad = [a for a in answers if not a.ok]
            self.send_to_frontend(bad[0] if bad else answers[0])
        counters = sum_counters([c for _, c in gathered])
        if counters != self.last_metrics:
            self.last_metrics = counters
            self.send_to_frontend(MetricsOutput(counters))


class DataParallelRouter:
    """SGLang's DataParallelController (round_robin): rank 0 names each new request's replica
    before the tick's broadcast, so every rank knows which replica serves it."""

    def __init__(self, dp_size: int):
        self.dp_size, self.next = dp_size, 0

    def dispatch(self, msgs: list) -> None:
        for msg in msgs:
            if isinstance(msg, TokenizedGenerateReqInput) and msg.data_parallel_rank is None:
                msg.data_parallel_rank, self.next = self.next, (self.next + 1) % self.dp_size


def sum_counters(all_counters: list[dict]) -> dict:
    """The replicas' totals: counters add up; a 0/1 gauge (writes enabled) holds for all only."""
    out: dict = {}
    for counters in all_counters:
        for name, value in counters.items():
            if isinstance(value, dict):
                into = out.setdefault(name, {})
                for k, v in value.items():
                    into[k] = into.get(k, 0) + v
            elif name == "hicache_storage_writes_enabled":
                out[name] = min(out.get(name, value), value)
            else:
                out[name] = out.get(name, 0) + value
    return out
