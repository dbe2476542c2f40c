# EXPECT: verdict=consistent
# SOURCE: https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.broadcast (src rank sends, all others receive into a same-shape buffer); common "rank 0 loads checkpoint, others allocate" pattern
# SHAPE: the source rank calls broadcast from the `if rank == src` arm with a freshly computed tensor while the other ranks call it from the `else` arm with an empty buffer, so the two calls are on different lines with different tensors, but they are one matched broadcast with the same src, shape and dtype.
# RUN: torchrun --standalone --nproc-per-node 2 a10_broadcast_arms.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

SRC = 0
SHAPE = (4, 4)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()

    if rank == SRC:
        weights = torch.arange(16, dtype=torch.float32).reshape(SHAPE)  # "loaded from disk"
        dist.broadcast(weights, src=SRC)  # sender arm
    else:
        weights = torch.empty(SHAPE, dtype=torch.float32)
        dist.broadcast(weights, src=SRC)  # receiver arm: different line, same collective

    # a second round the other way round: rank 1 is the source this time
    if rank == 1:
        seed = torch.tensor([1234])
        dist.broadcast(seed, src=1)
    else:
        seed = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(seed, src=1)

    assert weights.sum().item() == 120.0 and seed.item() == 1234
    print(f"rank {rank}: weights sum {weights.sum().item():.0f}, seed {seed.item()}: OK", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
