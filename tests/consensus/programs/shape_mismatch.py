"""Rank 1 all_reduces 8 floats where rank 0 all_reduces 4: gloo aborts the
receiver ("op.preamble.length <= op.nbytes"). Clean twin: PROG_FIX=1."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402

rank, world = init()
for step in range(4):
    n = 8 if rank == 1 and step == 2 and not fixed() else 4
    dist.all_reduce(ones(n))  # SITE:reduce
finish()
