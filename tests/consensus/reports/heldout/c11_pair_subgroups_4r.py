# EXPECT: verdict=consistent
# NPROC: 4
# SOURCE: https://github.com/pytorch/pytorch/pull/28247
# SHAPE: Every rank calls new_group for both pairs in the same order, then each rank reduces and barriers only inside its own pair subgroup, followed by a world all_reduce.
import datetime
import os
import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    pairs = [[0, 1], [2, 3]]
    groups = [dist.new_group(p) for p in pairs]  # all ranks create all groups
    mine = groups[rank // 2]
    w = torch.full((3,), float(rank))
    for epoch in range(3):
        local = w * (epoch + 1)
        dist.all_reduce(local, group=mine)  # only the two members of this pair take part
        dist.barrier(group=mine)
        w = local / 2
        total = w.sum().reshape(1)
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: world total {total.item():.2f}")
    print(f"[rank{rank}] pair {pairs[rank // 2]} w={w.tolist()}")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
