# EXPECT: verdict=hung culprit=0,1 line=19
# KIND: wait_cycle
# SOURCE: https://github.com/NVIDIA/nccl/issues/479 (rank 0: send x0 then recv x1; rank 1: send x1 then recv x0 -> stuck); https://github.com/autoscriptlabs/nccl-mesh-plugin/pull/14 (both ranks sending large tensors simultaneously deadlock)
# SHAPE: a 1-D halo exchange written with separate branches where rank 1's branch was copied from rank 0's instead of being flipped, so both ranks call a blocking dist.send of an 8 MiB slab before their dist.recv and wait on each other forever.
# RUN: torchrun --standalone --nproc-per-node 2 b02_send_send_halo_branches.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
edge = torch.full((2 << 20,), float(rank))  # my boundary slab, 8 MiB
ghost = torch.empty_like(edge)  # neighbour's boundary slab

if rank == 0:
    dist.send(edge, dst=1)  # <-- BUG: rank 0 sends first ...
    dist.recv(ghost, src=1)
else:
    dist.send(edge, dst=0)  # ... and so does rank 1 (should be recv first)
    dist.recv(ghost, src=0)

print(f"rank {rank}: ghost cell {ghost[0].item():.0f}", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
