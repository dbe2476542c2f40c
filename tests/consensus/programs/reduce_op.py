"""Rank 1 reduces with MAX where its peers use SUM: same bytes, so nothing in
torch notices. Run with 3 ranks: rank 1 is the odd one out. Clean twin: PROG_FIX=1."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402

rank, world = init()
for step in range(4):
    op = dist.ReduceOp.MAX if rank == 1 and step == 1 and not fixed() else dist.ReduceOp.SUM
    dist.all_reduce(ones(2), op=op)  # SITE:reduce
finish()
