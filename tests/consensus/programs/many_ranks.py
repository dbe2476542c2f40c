"""A world of many gloo ranks (64 in the test), a loop of all_reduces, and one rank (37) that
makes one extra same-shape all_reduce at step 10: it pairs silently, then every other rank
waits in the final barrier while rank 37 waits in its 21st all_reduce. Clean twin: PROG_FIX=1."""

import os
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import finish, fixed, init, ones  # noqa: E402

rank, world = init(timeout_s=120)
odd = int(os.environ.get("PROG_ODD_RANK", "37"))
t = ones(4)
for step in range(20):
    dist.all_reduce(t)  # SITE:loop
    if rank == odd and step == 10 and not fixed():
        dist.all_reduce(ones(4))  # SITE:extra
dist.barrier()  # SITE:barrier
finish()
