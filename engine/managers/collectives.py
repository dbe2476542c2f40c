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
    def __init__(self, group, world_size: int):
        self.group = group
        self.world_size = world_size  # with one rank each method returns its input

    def broadcast_reqs(self, msgs: list) -> list:
        """recv, every tick: rank 0's frontend messages become every rank's input."""
        if self.world_size == 1:
            return msgs
        box = [msgs]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def agree_admitted(self, admitted: int) -> int:
        """schedule, whenever the waiting queue is non-empty and a request slot is free:
        MIN of the admitted count (its budgets are rank-local), so every rank cuts the
        identically ordered candidates to the same batch."""
        if self.world_size == 1:
            return admitted
        t = torch.tensor([admitted], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())
