"""assert_same and @rank_consensus: rank 1 computes a different admission
decision; no collective differs. Clean twin: PROG_FIX=1."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402

from hctool.consensus import assert_same, rank_consensus  # noqa: E402

rank, world = init()


@rank_consensus(same_params=True, same_results=True)
def admit(queue_len, free_pages):
    return min(queue_len, free_pages)


for step in range(3):
    free = 5 if rank == 1 and step == 1 and not fixed() else 4
    n = admit(8, free)  # SITE:admit
    assert_same("step", step)  # SITE:step
    dist.all_reduce(ones(1))  # SITE:sync
finish()
