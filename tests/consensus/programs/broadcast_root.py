"""Rank 1 believes it is the broadcast root: both ranks send, the job goes on
with wrong data. Clean twin: PROG_FIX=1."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402

rank, world = init()
for step in range(3):
    src = 1 if rank == 1 and step == 1 and not fixed() else 0
    dist.broadcast(ones(3), src=src)  # SITE:bcast
    dist.all_reduce(ones(1))  # SITE:sync
finish()
