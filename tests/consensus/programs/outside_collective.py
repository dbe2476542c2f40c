"""Rank 1 is alive but outside any collective (it waits for a data loader that
never delivers) while rank 0 already waits in a barrier the group never used
before. The absent rank 1 is the culprit (`missing`), not rank 0's barrier.
Clean twin: PROG_FIX=1."""

import queue
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402


def next_batch(loader: queue.Queue):
    return loader.get(timeout=120)  # SITE:stall


rank, world = init()
loader: queue.Queue = queue.Queue()
for step in range(3):
    dist.all_reduce(ones(2))  # SITE:reduce
if rank == 1 and not fixed():
    next_batch(loader)  # its worker died: nothing ever arrives
dist.barrier()  # SITE:barrier
finish()
