# EXPECT: verdict=consistent
# SOURCE: NVIDIA/Megatron-LM megatron/core/parallel_state.py initialize_model_parallel (every rank loops over all groups calling new_group, keeps the one it belongs to)
# SHAPE: each rank only ever runs collectives on 2 of the 4 groups it created, and the groups used differ per rank, which looks like ranks using different communicators, but new_group is called for every group in the same order on every rank and each group is used by exactly its members.
# RUN: torchrun --standalone --nproc-per-node 4 a20_megatron_style_groups.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=60)

dist.init_process_group("gloo", timeout=TIMEOUT)
rank, world = dist.get_rank(), dist.get_world_size()
tp_size = 2

tp_group = dp_group = None
for start in range(0, world, tp_size):  # tensor-parallel groups [0,1], [2,3]
    ranks = list(range(start, start + tp_size))
    g = dist.new_group(ranks, timeout=TIMEOUT)  # called by ALL ranks, same order
    if rank in ranks:
        tp_group = g
for off in range(tp_size):  # data-parallel groups [0,2], [1,3]
    ranks = list(range(off, world, tp_size))
    g = dist.new_group(ranks, timeout=TIMEOUT)
    if rank in ranks:
        dp_group = g

x = torch.tensor([float(rank)])
dist.all_reduce(x, group=tp_group)  # only my tp peers take part
y = torch.tensor([float(rank)])
dist.all_reduce(y, group=dp_group)  # only my dp peers take part

tp_expect = sum(range(rank - rank % tp_size, rank - rank % tp_size + tp_size))
dp_expect = sum(range(rank % tp_size, world, tp_size))
assert x.item() == tp_expect and y.item() == dp_expect, (x, y)
print(f"rank {rank}: tp sum {x.item():.0f}, dp sum {y.item():.0f}: OK", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
