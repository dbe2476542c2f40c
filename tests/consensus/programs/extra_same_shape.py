"""Rank 0 issues one all_reduce more than its peer, same shape: gloo pairs it
silently with the peer's next call. Clean twin: PROG_FIX=1."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402

rank, world = init()
t = ones(4)
for step in range(6):
    dist.all_reduce(t)  # SITE:loop
    if rank == 0 and step == 2 and not fixed():
        dist.all_reduce(t)  # SITE:extra
finish()
