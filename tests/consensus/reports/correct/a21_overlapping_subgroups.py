# EXPECT: verdict=consistent
# SOURCE: https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.new_group ("requires that all processes in the main group enter this function, even if they are not going to be members of the group"); https://github.com/mpi-forum/mpi-issues/issues/532 (overlapping communicators)
# SHAPE: rank 0 only reduces on group A, rank 2 only on group B, and rank 1 on both, so the ranks issue different numbers of collectives, but both groups were created by all ranks in the same order and every group collective is matched by all of its members.
# RUN: torchrun --standalone --nproc-per-node 3 a21_overlapping_subgroups.py
import datetime
import os
import sys

import torch
import torch.distributed as dist


def main():
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    group_a = dist.new_group([0, 1], timeout=timeout)  # everyone creates A ...
    group_b = dist.new_group([1, 2], timeout=timeout)  # ... then B, even non-members

    total = torch.tensor([0.0])
    if rank in (0, 1):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=group_a)  # A: ranks 0 and 1 only
        total += t
    if rank in (1, 2):
        t = torch.tensor([float(10 * (rank + 1))])
        dist.all_reduce(t, group=group_b)  # B: ranks 1 and 2 only
        total += t

    expected = {0: 3.0, 1: 53.0, 2: 50.0}[rank]
    assert total.item() == expected, total
    dist.barrier()
    print(f"rank {rank}: subgroup total {total.item():.0f}: OK", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
