"""The SGLang #30760 shape. Each tick rank 0 broadcasts the request list; the
admission loop breaks on `batch_is_full`, computed from the rank's own free
slots, and calls check_prefetch_progress (an all_reduce MAX) per request. In
tick 2 rank 0 has one more free slot, votes once more, and meets its peer's
next-tick broadcast. Clean twin (PROG_FIX=1): vote for the whole broadcast
queue once per tick, before the loop (the #33029 fix)."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init  # noqa: E402

rank, world = init()


def broadcast_reqs(tick):
    reqs = [[f"req{tick}-{i}" for i in range(4)]] if rank == 0 else [None]
    dist.broadcast_object_list(reqs, src=0)  # SITE:bcast
    return reqs[0]


def check_prefetch_progress(rid):
    vote = torch.tensor([0, 1], dtype=torch.int64)
    dist.all_reduce(vote, op=dist.ReduceOp.MAX)  # SITE:vote
    return bool(vote[1])


def check_all_prefetch_progress(rids):
    votes = torch.ones(len(rids), dtype=torch.int64)
    dist.all_reduce(votes, op=dist.ReduceOp.MAX)  # SITE:bulkvote
    return {rid: bool(v) for rid, v in zip(rids, votes)}


def free_slots(tick):
    return 3 if rank == 0 and tick == 2 else 2  # rank-local: free pages differ


def get_new_batch_prefill(waiting, tick):
    batch = []
    done = check_all_prefetch_progress(waiting) if fixed() else None
    for rid in waiting:
        if len(batch) >= free_slots(tick):  # batch_is_full, from rank-local state
            break
        ok = done[rid] if fixed() else check_prefetch_progress(rid)  # SITE:call
        if ok:
            batch.append(rid)
    return batch


for tick in range(4):
    waiting = broadcast_reqs(tick)
    get_new_batch_prefill(waiting, tick)
finish()
