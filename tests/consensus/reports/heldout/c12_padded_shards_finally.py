# EXPECT: verdict=consistent
# NPROC: 2
# SOURCE: https://pytorch.org/docs/stable/_modules/torch/utils/data/distributed.html
# SHAPE: Uneven shards are padded to equal length like DistributedSampler, per-rank errors are caught locally, and the all_reduce sits in a finally block so every rank reaches it each step; results are gathered with all_gather_object of variable-length lists.
import datetime
import math
import os
import sys

import torch
import torch.distributed as dist


def padded_shard(n_items, rank, world):
    per = math.ceil(n_items / world)
    idx = list(range(n_items)) + list(range(per * world - n_items))  # wrap-around padding
    return idx[rank::world]


def forward(i):
    if i == 5:
        raise RuntimeError("out of memory")  # only the rank that owns item 5 hits this
    return torch.full((4,), float(i))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    ok = []
    for i in padded_shard(9, rank, world):
        grad = torch.zeros(4)
        try:
            grad = forward(i)
            ok.append(i)
        except RuntimeError:
            grad = torch.zeros(4)  # contribute nothing, but still join the reduce
        finally:
            dist.all_reduce(grad)
    everyone = [None] * world
    dist.all_gather_object(everyone, ok)  # per-rank lists of different lengths are fine here
    if rank == 0:
        print(f"processed per rank: {everyone}")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
