"""Four ranks, two overlapping groups: the default group and a tensor-parallel
group of the same ranks created after it. Each step every rank all-reduces once
in each; ranks 2 and 3 pick the order from a rank-local flag (their prefetch
finished early), so in step 1 ranks 0 and 1 wait in the default group for
ranks 2 and 3, which wait in the tensor-parallel group for ranks 0 and 1: a wait
cycle through every rank, though no rank issued a call more or less than its
peers. Correct program: PROG_FIX=1 (the same order everywhere)."""

import datetime
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402

rank, world = init(timeout_s=60)
tp = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=60))


def prefetch_done_early(step: int) -> bool:
    return rank >= 2 and step == 1 and not fixed()  # rank-local: this rank's IO thread


for step in range(3):
    if prefetch_done_early(step):
        dist.all_reduce(ones(2), group=tp)  # SITE:tp_early
        dist.all_reduce(ones(2))  # SITE:world_late
    else:
        dist.all_reduce(ones(2))  # SITE:world
        dist.all_reduce(ones(2), group=tp)  # SITE:tp
finish()
