"""DDP with uneven inputs handled by torch.distributed.algorithms.Join, PyTorch's
own answer: rank 0 runs out of batches first, and inside Join's exit it shadows
the peers' per-step collectives (the join notification and the gradient bucket
all-reduces) from the `with` line, while rank 1 issues them from its forward
and backward lines. They pair by design. Misuse (the default): no Join, so
rank 1's extra backward all-reduces alone. Correct program: PROG_FIX=1."""

import contextlib
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch  # noqa: E402
from common import fixed, finish, init  # noqa: E402
from torch.distributed.algorithms.join import Join  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

rank, world = init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
ddp = DDP(model, bucket_cap_mb=2 / 1024)  # a few buckets per step
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
batches = 4 + 2 * rank  # uneven inputs: rank 1 has two batches more
with Join([ddp]) if fixed() else contextlib.nullcontext():  # SITE:join
    for step in range(batches):
        loss = ddp(torch.randn(8, 32)).square().mean()  # SITE:forward
        opt.zero_grad()
        loss.backward()  # SITE:backward
        opt.step()
print(f"rank {rank} ran {batches} batches", flush=True)
del ddp  # a Join-ed DDP model alive at destroy_process_group can crash the interpreter at exit
finish()
