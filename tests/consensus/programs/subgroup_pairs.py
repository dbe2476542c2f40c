"""Rank 0 issues one extra all_reduce in the tensor-parallel subgroup. It pairs
silently with rank 1's next same-shape call there (the "mlp" one), so both
return; then rank 0 waits in the subgroup for a call rank 1 already made, while
rank 1 waits in the default group: a wait cycle across two groups. The culprit
is rank 0 (it inserted the call), and the cycle is reported when it forms.
Clean twin: PROG_FIX=1."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402

rank, world = init(timeout_s=60)
tp = dist.new_group(list(range(world)))
for step in range(4):
    dist.all_reduce(ones(2))  # SITE:world
    dist.all_reduce(ones(4), group=tp)  # SITE:attn
    if rank == 0 and step == 1 and not fixed():
        dist.all_reduce(ones(4), group=tp)  # SITE:extra
    dist.all_reduce(ones(4), group=tp)  # SITE:mlp
finish()
