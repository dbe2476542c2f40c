# EXPECT: verdict=consistent
# SOURCE: https://docs.pytorch.org/tutorials/advanced/generic_join.html ("shadow" collectives for ranks that ran out of inputs), done by hand with an agreed MAX trip count
# SHAPE: a rank that has run out of data calls all_reduce from the `else` branch with a zero tensor while the others call it from the `if` branch, so the calls sit on different lines, but the trip count was agreed with MAX and every iteration issues exactly one all_reduce per rank.
# RUN: torchrun --standalone --nproc-per-node 2 a06_max_trip_count_shadow.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()

samples = list(range(10 * rank, 10 * rank + 4 + 3 * rank))  # rank 0: 4 items, rank 1: 7 items
trips = torch.tensor([len(samples)])
dist.all_reduce(trips, op=dist.ReduceOp.MAX)

total = torch.zeros(2)  # (sum of items, count of items)
for i in range(int(trips.item())):
    if i < len(samples):
        contrib = torch.tensor([float(samples[i]), 1.0])
        dist.all_reduce(contrib)
    else:
        contrib = torch.zeros(2)  # out of data: shadow all-reduce that adds nothing
        dist.all_reduce(contrib)
    total += contrib

all_items = list(range(0, 4)) + list(range(10, 17))
assert total.tolist() == [float(sum(all_items)), float(len(all_items))], total
print(f"rank {rank}: {len(samples)} local, {int(trips)} trips, mean={total[0] / total[1]:.3f}: OK", flush=True)

dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
