"""A torch.distributed job that never ends on its own: an all_reduce every 50 ms."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
x = torch.ones(1)
print(f"rank {dist.get_rank()} running", flush=True)
while True:
    dist.all_reduce(x)
    x.fill_(1)
    time.sleep(0.05)
