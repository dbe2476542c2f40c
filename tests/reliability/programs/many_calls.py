"""CALLS small all_reduces, then one line with the result (the same with or without hctool).
LIMIT_RANK=R: rank R may write files of at most LIMIT_BYTES (RLIMIT_FSIZE): its trace cannot grow."""

import os
import resource

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
if os.environ.get("LIMIT_RANK") == str(rank):
    limit = int(os.environ["LIMIT_BYTES"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
dist.init_process_group("gloo")
n = int(os.environ.get("CALLS", "20000"))
x = torch.ones(1)
total = 0
for i in range(n):
    x.fill_(i % 7)
    dist.all_reduce(x)
    total += int(x)
print(f"rank {rank}: {n} calls, total {total}", flush=True)
dist.destroy_process_group()
