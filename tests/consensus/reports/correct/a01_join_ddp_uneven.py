# EXPECT: verdict=consistent
# SOURCE: https://docs.pytorch.org/tutorials/advanced/generic_join.html (Join context manager with DDP, uneven inputs)
# SHAPE: rank 1 runs two more backward passes (two more DDP gradient all-reduces) than rank 0, which looks like extra collectives, but Join makes the early-finished rank 0 shadow them, so the collective sequences still match.
# RUN: torchrun --standalone --nproc-per-node 2 a01_join_ddp_uneven.py
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    # uneven shards: rank 0 has 5 batches, rank 1 has 7 (two more)
    n_batches = 5 + 2 * rank
    g = torch.Generator().manual_seed(100 + rank)
    batches = [torch.randn(4, 8, generator=g) for _ in range(n_batches)]

    # rank 0 leaves the loop first; Join shadows rank 1's last two all-reduces
    with Join([model]):
        for x in batches:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()

    # Join's post-hook syncs the final model, so replicas are identical
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    got = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(got, flat)
    assert all(torch.equal(got[0], t) for t in got), "replicas diverged"
    print(f"rank {rank}: {n_batches} batches, replicas identical: OK", flush=True)

    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
