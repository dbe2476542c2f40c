"""SGLang: srt/managers/scheduler.py (recv_requests) and scheduler_output_processor_mixin.py.

Request I/O of the tick: rank 0 polls the frontend and every rank receives the
same messages through `TickCollectives.broadcast_reqs`; outputs queue up during
the tick and rank 0 sends them (then the metrics, when they changed) at its end.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.managers.collectives import TickCollectives


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

    def recv_requests(self, idle: bool, did_work: bool) -> list:
        """Every rank, every tick: the frontend's messages in rank 0's order."""
        msgs: list = []
        if self.tp_rank == 0 and self.recv_from_frontend is not None:
            # Block briefly when idle; spin when the last tick did work.
            msgs = self.recv_from_frontend(0.05 if idle else (0.0 if did_work else 0.005))
        if self.tp_rank == 0 and self.decisions:
            msgs, self.decisions = self.decisions + msgs, []
        return self.sync.broadcast_reqs(msgs)

    def send(self, out) -> None:
        self.outputs.append(out)

    def flush(self, metrics_fn: Callable[[], object]) -> None:
        """Rank 0 sends results, then the metrics when they changed."""
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
