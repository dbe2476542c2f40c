# EXPECT: verdict=consistent
# SOURCE: https://github.com/Project-MONAI/monai-physio/pull/137 (review: "Synchronize the non-finite-loss decision across ranks" before `continue`); https://github.com/OpenBMB/BMTrain/issues/108
# SHAPE: in a helper, rank 2 decides locally that its batch is empty and the loop body `continue`s before the all_gather, which looks like a rank-local early exit, but the emptiness count is all-reduced first and the loop skips only when any rank is empty, on all ranks at once.
# RUN: torchrun --standalone --nproc-per-node 3 a14_skip_empty_batch_any_rank.py
import datetime
import os
import sys

import torch
import torch.distributed as dist


def local_batch(rank, step):
    if rank == 2 and step % 3 == 1:
        return torch.empty(0)  # filtered-out batch on this rank only
    return torch.full((2,), float(step * 10 + rank))


def any_rank_empty(batch):
    n_empty = torch.tensor([1 if batch.numel() == 0 else 0])
    dist.all_reduce(n_empty)  # SUM of per-rank flags
    return n_empty.item() > 0


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    used = []
    for step in range(7):
        batch = local_batch(rank, step)
        if any_rank_empty(batch):
            continue  # safe: the decision is global
        parts = [torch.empty(2) for _ in range(world)]
        dist.all_gather(parts, batch)
        used.append(int(parts[0][0].item()) // 10)
    assert used == [0, 2, 3, 5, 6], used
    print(f"rank {rank}: used steps {used}: OK", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
