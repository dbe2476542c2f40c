# EXPECT: verdict=consistent
# SOURCE: https://docs.pytorch.org/tutorials/advanced/generic_join.html (section "Using Join with DistributedDataParallel and ZeroRedundancyOptimizer")
# SHAPE: rank 0 loops over two more batches than rank 1, so its DDP all-reduces and ZeRO step broadcasts look unmatched, but both DDP and ZeroRedundancyOptimizer are Joinables whose hooks shadow those collectives on the joined rank.
# RUN: torchrun --standalone --nproc-per-node 2 a02_join_ddp_zero.py
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(1)
net = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Linear(6, 1))
model = DDP(net)
optim = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.05)

steps = 6 if rank == 0 else 4  # rank 0 has two extra batches
seen = 0
with Join([model, optim]):  # both joinables shadow the missing collectives on rank 1
    for i in range(steps):
        x = torch.full((3, 6), float(i + rank))
        optim.zero_grad()
        loss = model(x).sum()
        loss.backward()
        optim.step()
        seen += 1

params = torch.cat([p.detach().flatten() for p in model.parameters()])
ref = params.clone()
dist.broadcast(ref, src=0)
assert torch.allclose(ref, params), "ZeRO shards out of sync"
print(f"rank {rank}: {seen} local steps, params in sync: OK", flush=True)

dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
