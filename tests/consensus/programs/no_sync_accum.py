"""Gradient accumulation with DDP's no_sync(): the micro-batches of a step run
their backward under no_sync() (no all-reduce), the last one all-reduces the
accumulated gradients. Misuse (the default): only rank 1 enters no_sync()
(its accumulation setting came from a rank-local config), so rank 0 all-reduces
every micro-batch from the accumulation line: one call more per micro-batch,
paired with rank 1's step all-reduces. Correct program: PROG_FIX=1."""

import contextlib
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch  # noqa: E402
from common import fixed, finish, init  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

rank, world = init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
accumulate = 3
for step in range(3):
    opt.zero_grad()
    for micro in range(accumulate - 1):
        with ddp.no_sync() if rank == 1 or fixed() else contextlib.nullcontext():
            ddp(torch.randn(8, 32)).square().mean().backward()  # SITE:accumulate
    ddp(torch.randn(8, 32)).square().mean().backward()  # SITE:sync
    opt.step()
finish()
