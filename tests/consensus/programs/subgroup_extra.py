"""An extra all_reduce in a subgroup (creation index 1) while the default group
agrees. Clean twin: PROG_FIX=1."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402

rank, world = init()
tp_group = dist.new_group(list(range(world)))
for step in range(4):
    dist.all_reduce(ones(2))  # SITE:world
    dist.all_reduce(ones(3), group=tp_group)  # SITE:sub
    if rank == 0 and step == 1 and not fixed():
        dist.all_reduce(ones(3), group=tp_group)  # SITE:subextra
dist.barrier()  # SITE:barrier
finish()
