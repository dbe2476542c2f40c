"""Four gloo ranks that agree, shaped to stress a timeline: the last rank enters each step first
(so a pairing's arrow must start on it, not on rank 0), two async all_reduces in flight at once
(overlapping calls: extra lanes), a p2p ring, subgroups, a broadcast from the last rank and
labelled values. Consistent: every rank makes the same calls."""

import sys
import time

sys.path.insert(0, __file__.rsplit("/", 3)[0] + "/consensus/programs")
import torch.distributed as dist  # noqa: E402
from common import finish, init, ones  # noqa: E402

from hctool.consensus import assert_same  # noqa: E402

rank, world = init()
halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]
mine = halves[rank // 2]
for step in range(3):
    time.sleep(0.03 * (world - 1 - rank))  # the later the rank, the earlier it enters
    dist.all_reduce(ones(4))
    first = dist.all_reduce(ones(8), async_op=True)
    second = dist.all_reduce(ones(8), async_op=True)  # in flight beside the first one
    first.wait()
    second.wait()
    ops = [dist.P2POp(dist.isend, ones(2), (rank + 1) % world), dist.P2POp(dist.irecv, ones(2), (rank - 1) % world)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    dist.all_reduce(ones(3), group=mine)
    dist.broadcast(ones(2), src=world - 1)
    assert_same("step", step)
finish()
