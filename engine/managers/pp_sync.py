"""SGLang: the PP consistency of HiCache (#22607 -> #27010 `pp_sync`, #29258; bytedance-iaas's
PP0-authoritative verdicts). No single file upstream: there the calls sit in hiradix_cache.py,
cache_controller.py and the scheduler's PP loop.

With pipeline stages every stage runs the same scheduler over its own layers' KV: its own L1
pool, host pool and L3 pages. The scheduler's decisions must come out identical on every
stage, or stage 1 runs a batch whose extend lengths differ from the hidden states stage 0
sends it. HiCache's agreements (ready acks, prefetch verdicts and completed tokens, the
storage hit) were designed for the TP ranks of one stage; `StageSync` says how they reach
across stages (`--pp-hicache-sync`):

- per-stage (before #27010): each stage agrees over its own TP ranks only. A stage whose L3
  answers differently (a failed get, a miss) or whose copies finish a tick later admits
  another prefix than stage 0: the stages' extend lengths part.
- stage0 (#27010 pp_sync): each stage agrees over its TP ranks, then stage 0's result is
  broadcast to every stage; a later stage consumes exactly that count, waiting for its own
  copies to reach it (an ack pop waits for the copy's event; a prefetch is not ended before
  its IO thread fetched stage 0's number of pages).
- min (the prefetch_sync_thread's MIN, #29258): the same reductions over every rank of
  every stage at once.

Host capacity (#29258): with stage0 or min the stages' host pool sizes are MIN-reduced at
start, so no stage evicts or fails an allocation another does not.

Not covered under stage0: the health flags that ride check_hicache_events' packed call (IO
thread failed, storage writes failed, damaged pages) are stage 0's too, so a later stage's
own IO failure is not raised on every stage in one tick (min covers it).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

CATCH_UP_S = 120.0  # a later stage waits this long for its own copies to reach stage 0's count


class StageSync:
    """The all_reduce HiCache's agreements use under PP (one for the scheduler's cache
    agreement, one for the prefetch thread's storage hit: each its own pair of groups)."""

    def __init__(self, mode: str, stage_group, world_group, pp_rank: int):
        self.mode, self.stage_group, self.world_group, self.pp_rank = mode, stage_group, world_group, pp_rank

    @property
    def follows_stage0(self) -> bool:
        """This stage consumes stage 0's counts (and may have to wait to have them)."""
        return self.mode == "stage0" and self.pp_rank > 0

    def all_reduce(self, t: torch.Tensor, op) -> None:
        if self.mode == "min":
            dist.all_reduce(t, op=op, group=self.world_group)
            return
        dist.all_reduce(t, op=op, group=self.stage_group)
        if self.mode == "stage0":
            dist.broadcast(t, src=0, group=self.world_group)  # global rank 0: stage 0's first rank


def catch_up(op, tokens: int) -> None:
    """stage0 on a later stage: before a prefetch ends, its IO thread must have fetched the
    tokens stage 0 counted (it keeps fetching until told to stop). A stage that cannot reach
    them (its own pages are missing) is what the fork's two-phase verdicts were for: raise."""
    deadline = time.monotonic() + CATCH_UP_S
    while op.completed_tokens < tokens and not op.done.is_set():
        if time.monotonic() > deadline:
            break
        time.sleep(0.002)
    if op.completed_tokens < tokens:
        raise RuntimeError(
            f"prefetch {op.rid}: stage 0 counted {tokens} tokens, this stage fetched {op.completed_tokens}"
        )


def min_host_pages(pages: int, world_group) -> int:
    """#29258: the host capacity every stage uses is the smallest any rank has."""
    t = torch.tensor([pages], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=world_group)
    return int(t.item())
