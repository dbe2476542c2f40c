# EXPECT: verdict=consistent
# SOURCE: facebookresearch/fairseq2 src/fairseq2/datasets/utils.py (_reduce_num_batches: ranks agree on the minimum batch count before iterating)
# SHAPE: each rank owns a different number of batches and the loop bound comes from rank-local data, which looks like uneven collective counts, but the bound is first all-reduced with MIN so every rank runs the same number of gradient all-reduces.
# RUN: torchrun --standalone --nproc-per-node 2 a05_min_trip_count.py
import datetime
import os
import sys

import torch
import torch.distributed as dist


def agreed_num_batches(local_n):
    n = torch.tensor([local_n], dtype=torch.int64)
    dist.all_reduce(n, op=dist.ReduceOp.MIN)  # everyone stops at the shortest shard
    return int(n.item())


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = [torch.full((4,), float(rank + 1)) for _ in range(3 + 2 * rank)]  # 3 vs 5 batches

    w = torch.zeros(4)
    steps = agreed_num_batches(len(shard))
    for i in range(steps):
        grad = shard[i].clone()
        dist.all_reduce(grad)  # same call, same count on every rank
        w -= 0.1 * grad / world

    expected = -0.1 * steps * sum(r + 1 for r in range(world)) / world
    assert torch.allclose(w, torch.full((4,), expected)), w
    print(f"rank {rank}: local {len(shard)} batches, ran {steps}, w[0]={w[0]:.3f}: OK", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
