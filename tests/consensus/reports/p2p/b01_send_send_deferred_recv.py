# EXPECT: verdict=hung culprit=0,1 line=29
# KIND: wait_cycle
# SOURCE: https://github.com/pytorch/pytorch/pull/11275 ("imagine a 1GB tensor being sent to every other rank. It can only go through if there is a recv on the other side, or it will deadlock"); https://github.com/NVIDIA/nccl/issues/479
# SHAPE: an interleaved two-stage schedule that defers every recv until after its own send makes both ranks block in dist.send to each other (gloo send waits for the peer's recv), so neither reaches its recv: a send/send wait cycle.
# RUN: torchrun --standalone --nproc-per-node 2 b01_send_send_deferred_recv.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

MB = 4  # micro-batches
N = 2 << 20  # 8 MiB per activation


def stage_forward(rank, mb):
    return torch.full((N,), float(10 * rank + mb))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    peer = 1 - rank
    inbox = torch.empty(N)
    for mb in range(MB):
        out = stage_forward(rank, mb)
        # "interleaved" schedule: push my chunk first, pull the peer's chunk afterwards
        dist.send(out, dst=peer)  # <-- BUG: both ranks block here; no recv is posted
        dist.recv(inbox, src=peer)
        print(f"rank {rank}: mb {mb} got {inbox[0].item():.0f}", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
