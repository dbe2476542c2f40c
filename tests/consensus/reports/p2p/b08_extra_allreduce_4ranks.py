# EXPECT: verdict=diverged culprit=2 line=34
# KIND: extra
# SOURCE: https://github.com/radixark/miles/pull/2684 (all_reduce reached by only some ranks deadlocks); https://github.com/OpenTSLM/OpenTSLM/pull/49 (rank-dependent guard changes the collective sequence)
# SHAPE: at step 50 of 200 a rank-local outlier check makes only the culprit rank issue an extra all_reduce of the same shape, which silently pairs with the other ranks' regular all_reduce, shifts every later step by one (wrong sums are printed) and leaves the culprit one all_reduce ahead when the others reach the final barrier.
# RUN: torchrun --standalone --nproc-per-node 4 b08_extra_allreduce_4ranks.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

STEPS = 200
CULPRIT = 2
BAD_STEP = 50


def local_batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.rand(64, generator=g)
    if rank == CULPRIT and step == BAD_STEP:
        x[0] = 1e4  # a single outlier sample on one rank
    return x


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    first_bad = None
    for step in range(STEPS):
        x = local_batch(rank, step)
        if x.max() > 100:  # rank-local outlier check
            probe = torch.full((64,), -1.0)
            dist.all_reduce(probe)  # <-- BUG: extra same-shape all_reduce, only on the rank that saw the outlier
        stamp = torch.full((64,), float(step))  # every rank contributes its step index
        dist.all_reduce(stamp)
        if first_bad is None and stamp[0].item() != world * step:
            first_bad = step
            print(f"rank {rank}: wrong all_reduce result at step {step}: {stamp[0].item():.0f} != {world * step}", flush=True)
    print(f"rank {rank}: loop finished, first wrong step {first_bad}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
