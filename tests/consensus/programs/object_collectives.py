"""Rank 1 gathers objects where rank 0 broadcasts them. Clean twin: PROG_FIX=1."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init  # noqa: E402

rank, world = init()
for step in range(3):
    objs = [{"step": step}] if rank == 0 else [None]
    if rank == 1 and step == 1 and not fixed():
        out = [None] * world
        dist.all_gather_object(out, {"step": step})  # SITE:gather
    else:
        dist.broadcast_object_list(objs, src=0)  # SITE:bcast
finish()
