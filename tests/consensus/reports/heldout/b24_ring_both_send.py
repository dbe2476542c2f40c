# EXPECT: verdict=hung culprit=0,1
# NPROC: 2
# SOURCE: https://github.com/NVIDIA/nccl/issues/479
# SHAPE: A halo exchange has every rank do a blocking send to its neighbour before its recv; with gloo's blocking send both ranks wait in send forever.
import datetime

import torch
import torch.distributed as dist


def exchange_halo(local, rank, world):
    right, left = (rank + 1) % world, (rank - 1) % world
    halo = torch.empty_like(local[-1])
    dist.send(local[-1].contiguous(), dst=right)  # BUG: everyone sends first, nobody has posted a recv
    dist.recv(halo, src=left)
    return halo


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    grid = torch.arange(12, dtype=torch.float32).view(4, 3) + 100 * rank
    for it in range(2):
        halo = exchange_halo(grid, rank, world)
        grid[0] = 0.5 * (grid[0] + halo)
    print(f"[rank{rank}] grid row0 {grid[0].tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
