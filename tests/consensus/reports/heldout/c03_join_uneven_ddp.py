# EXPECT: verdict=consistent
# NPROC: 2
# SOURCE: https://pytorch.org/tutorials/advanced/generic_join.html
# SHAPE: The same ceil-based uneven partition as a known hang (rank 0 gets one more sample), but the DDP loop runs inside the Join context manager, which shadows the missing all_reduce on the rank that finishes first.
import datetime
import math
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def partition(total, rank, world):
    per = int(math.ceil(total / float(world)))
    return range(rank * per, min((rank + 1) * per, total))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = torch.randn(9, 5)
    targets = data.sum(1, keepdim=True)
    model = DDP(torch.nn.Linear(5, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = 0
    with Join([model]):
        for idx in partition(len(data), rank, world):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(data[idx:idx + 1]), targets[idx:idx + 1])
            loss.backward()
            opt.step()
            seen += 1
    print(f"[rank{rank}] trained on {seen} samples")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
