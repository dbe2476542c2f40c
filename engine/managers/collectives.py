"""SGLang: none (there these calls sit inline in srt/managers/scheduler.py).

The scheduler's per-tick collectives on the TP CPU group, one method each. Every
rank issues each at the same point of the tick, because what decides whether
it is issued is replicated; what it carries is rank-local (rank 0's frontend
queue, each rank's free counts) and comes back agreed. A rank that skips or
adds a call deadlocks its peers (SGLang #30760). HiRadixCache issues the
cache's own agreements (`check_hicache_events`, the prefetch votes) where
SGLang has them; docs/architecture.md tables every collective of a tick.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class TickCollectives:
    def __init__(self, group, world_size: int, parallel=None):
        """group/world_size: the ranks that must admit the same batch (a stage's or replica's TP
        ranks; under PP every rank of every stage). parallel: the rank's ParallelState: the
        request broadcast then reaches every rank of the job, and DP adds its own calls."""
        self.group = group
        self.world_size = world_size  # with one rank each method returns its input
        self.parallel = parallel
        multi = parallel is not None and (parallel.pp_size > 1 or parallel.dp_size > 1)
        self.recv_group = parallel.world_cpu_group if multi else group
        self.recv_size = parallel.tp_size * parallel.pp_size * parallel.dp_size if multi else world_size

    def broadcast_reqs(self, msgs: list) -> list:
        """recv, every tick: rank 0's frontend messages become every rank's input (under PP
        SGLang relays them stage to stage; under DP the router's choice rides along)."""
        if self.recv_size == 1:
            return msgs
        box = [msgs]
        dist.broadcast_object_list(box, src=0, group=self.recv_group)
        return box[0]

    def dp_has_unfinished(self, busy: bool) -> bool:
        """DP, every tick (vLLM's has_unfinished_requests across DP): whether any replica has
        requests. While one has, every replica takes part in every step, an idle one too."""
        t = torch.tensor([int(busy)], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.parallel.dp_cpu_group)
        return bool(t.item())

    def dp_gather_outputs(self, payload: object) -> list | None:
        """DP, every tick, on every rank: each replica's outputs to replica 0 over this
        tp_rank's DP group (to global rank tp_rank, replica 0's rank of it); only rank 0's
        gather (tp_rank 0) reaches the frontend, the others carry nothing. Every rank issues
        it, so the tick's DP calls are the same sequence on every tp_rank (None elsewhere)."""
        ps = self.parallel
        out = [None] * ps.dp_size if ps.rank == ps.tp_rank else None
        dist.gather_object(payload, out, dst=ps.tp_rank, group=ps.dp_cpu_group)
        return out

    def agree_admitted(self, admitted: int) -> int:
        """schedule, whenever the waiting queue is non-empty and a request slot is free:
        MIN of the admitted count (its budgets are rank-local), so every rank cuts the
        identically ordered candidates to the same batch."""
        if self.world_size == 1:
            return admitted
        t = torch.tensor([admitted], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())
