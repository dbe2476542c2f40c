"""DDP training on gloo where rank 1 gets one batch more than rank 0 (uneven
inputs) and every rank then waits in a barrier before saving: rank 1's extra
backward all-reduces while rank 0 already waits in the barrier. The culprit is
rank 1 (one call more), not both. Correct program: PROG_FIX=1."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

rank, world = init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
batches = 4 + (1 if rank == 1 and not fixed() else 0)
for step in range(batches):
    loss = ddp(torch.randn(8, 32)).square().mean()
    opt.zero_grad()
    loss.backward()  # SITE:backward
    opt.step()
dist.barrier()  # SITE:barrier
finish()
