"""SGLang: none (there these calls sit in scheduler.py and mem_cache/hiradix_cache.py).

The per-tick collective protocol of the TP CPU group, in one place. Every method
is one collective that every rank issues at the same point of the replicated
schedule; the caller turns rank-local state (a frontend queue, free counts, copy
events, IO threads, clocks) into a value every rank then agrees on. A rank that
skips or adds a call deadlocks its peers (SGLang #30760), so nothing else in the
engine may call torch.distributed on this group. docs/architecture.md lists them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class TickCollectives:
    def __init__(self, group, world_size: int | None = None):
        self.group = group
        self.world_size = dist.get_world_size(group) if world_size is None else world_size

    def _all_reduce(self, values: list[int], op) -> list[int]:
        t = torch.tensor(values, dtype=torch.int64)
        if self.world_size > 1:  # a group of one agrees with itself
            dist.all_reduce(t, op=op, group=self.group)
        return [int(x) for x in t.tolist()]

    # -- scheduler ---------------------------------------------------------------------
    def broadcast_reqs(self, msgs: list) -> list:
        """Every tick: rank 0's frontend messages to every rank (the only input)."""
        if self.world_size == 1:
            return msgs
        box = [msgs]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def agree_admitted(self, admitted: int) -> int:
        """Every tick with a waiting queue: MIN of the admitted count, whose budgets are
        rank-local; the identically ordered candidates are cut to the agreed count."""
        return self._all_reduce([admitted], dist.ReduceOp.MIN)[0]

    # -- HiRadixCache ------------------------------------------------------------------
    def agree_hicache_events(self, counts: list[int]) -> list[int]:
        """Every tick (HiCache): one packed MIN over ready acks, digests and health flags."""
        return self._all_reduce(counts, dist.ReduceOp.MIN)

    def vote_prefetch(self, not_terminable: int, terminate_flag: int) -> tuple[int, int]:
        """per-poll / bulk: MAX vote on whether one prefetch may end."""
        a, b = self._all_reduce([not_terminable, terminate_flag], dist.ReduceOp.MAX)
        return a, b

    def agree_completed(self, completed_tokens: int) -> int:
        """After a passed vote: MIN of the tokens each rank fetched."""
        return self._all_reduce([completed_tokens], dist.ReduceOp.MIN)[0]

    def vote_all_prefetches(self, votes: list[int]) -> list[int]:
        """per-tick: one MAX over [not terminable, -completed] of every live prefetch."""
        return self._all_reduce(votes, dist.ReduceOp.MAX)
