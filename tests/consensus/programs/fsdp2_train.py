"""FSDP2 (fully_shard) training on gloo: all-gathers in forward and backward,
reduce-scatters from backward, clip_grad_norm_ over sharded (DTensor) grads and
a distributed checkpoint save. Rank 1 takes one step more (its forward
all-gathers alone). Clean twin: PROG_FIX=1. argv[1]: checkpoint folder."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from common import fixed, finish, init  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

rank, world = init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)  # SITE:shard
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = 3 + (1 if rank == 1 and not fixed() else 0)
for step in range(steps):
    loss = model(torch.randn(8, 16)).square().mean()  # SITE:forward
    loss.backward()  # SITE:backward
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # SITE:clip
    opt.step()
    opt.zero_grad()
dcp.save({"model": model.state_dict()}, checkpoint_id=sys.argv[1])  # SITE:save
finish()
