# EXPECT: verdict=consistent
# NPROC: 2
# SOURCE: https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/core/pipeline_parallel/p2p_communication.py
# SHAPE: A halo exchange where even ranks send-then-recv and odd ranks recv-then-send, so the rank-dependent branches always form matching send/recv pairs.
import datetime
import os
import sys

import torch
import torch.distributed as dist


def exchange_halo(edge, rank, world):
    right, left = (rank + 1) % world, (rank - 1) % world
    halo = torch.empty_like(edge)
    if rank % 2 == 0:
        dist.send(edge, dst=right)
        dist.recv(halo, src=left)
    else:
        dist.recv(halo, src=left)
        dist.send(edge, dst=right)
    return halo


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    grid = torch.arange(12, dtype=torch.float32).view(4, 3) + 100 * rank
    for it in range(3):
        halo = exchange_halo(grid[-1].contiguous(), rank, world)
        grid[0] = 0.5 * (grid[0] + halo)
    print(f"[rank{rank}] row0={grid[0].tolist()}")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
