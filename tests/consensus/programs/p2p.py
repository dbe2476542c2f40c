"""Rank 0 sends four tensors; rank 1 posts one receive more than that and waits
forever. Clean twin: PROG_FIX=1."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402

rank, world = init()
receives = 4 if fixed() else 5
if rank == 0:
    for i in range(4):
        dist.send(ones(3), dst=1)  # SITE:send
elif rank == 1:
    for i in range(receives):
        dist.recv(ones(3), src=0)  # SITE:recv
finish()
