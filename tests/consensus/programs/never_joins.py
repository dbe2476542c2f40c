"""Rank 1 never joins the third all_reduce (it is busy elsewhere). Clean twin: PROG_FIX=1."""

import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402


def busy_elsewhere() -> None:
    time.sleep(120)  # SITE:sleep


rank, world = init()
for step in range(4):
    if rank == 1 and step == 2 and not fixed():
        busy_elsewhere()
    dist.all_reduce(ones(2))  # SITE:reduce
finish()
