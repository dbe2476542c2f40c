# EXPECT: verdict=consistent
# SOURCE: https://github.com/pytorch/pytorch/pull/11275 ("every send must be matched with a recv on the other side"); https://docs.pytorch.org/tutorials/intermediate/dist_tuto.html (blocking point-to-point)
# SHAPE: the two ranks call send and recv in opposite orders from different branches (rank 0: send then recv, rank 1: recv then send), which looks asymmetric, but each blocking send meets a posted recv so the exchange never waits on itself.
# RUN: torchrun --standalone --nproc-per-node 2 a17_pingpong_send_recv.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
ball = torch.zeros(1 << 20)  # 4 MiB, big enough that send really waits for the receiver

for rally in range(5):
    if rank == 0:
        ball += 1
        dist.send(ball, dst=1)  # serve
        dist.recv(ball, src=1)  # wait for the return
    else:
        dist.recv(ball, src=0)
        ball *= 2
        dist.send(ball, dst=0)

# x -> 2(x+1) five times from 0: 2, 6, 14, 30, 62
assert ball[0].item() == 62.0, ball[0]
print(f"rank {rank}: ball={ball[0].item():.0f} after 5 rallies: OK", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
