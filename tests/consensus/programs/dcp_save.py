"""torch.distributed.checkpoint.save on every rank (its planner gathers the
ranks' plans on the coordinator, scatters the final ones, then agrees on the
result). Misuse (the default): the save sits under `if rank == 0:`, the
torch.save habit; the other ranks go on to the end-of-epoch barrier (run it on
three ranks: two of them agree, so the odd one out is named). Correct program:
PROG_FIX=1. argv[1]: the checkpoint folder."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402

rank, world = init()
torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
for step in range(2):
    dist.all_reduce(ones(4))  # SITE:step
state = {"model": model.state_dict(), "step": 2}
if rank == 0 or fixed():
    dcp.save(state, checkpoint_id=f"{sys.argv[1]}/step2")  # SITE:save
dist.barrier()  # SITE:barrier
finish()
