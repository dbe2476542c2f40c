# EXPECT: verdict=diverged culprit=1 line=35
# KIND: missing
# SOURCE: https://github.com/Project-MONAI/monai-physio/pull/137 (review: a rank-local `continue` on a bad batch makes ranks issue different collective sequences and hang); https://github.com/ai2cm/ace/pull/850
# SHAPE: at step 120 of 200 a rank-local outlier check makes only the culprit rank `continue` past the step's all_reduce, so its later all_reduces pair with the other ranks' previous steps (wrong sums are printed) and it reaches the final barrier while the others still wait in their last all_reduce.
# RUN: torchrun --standalone --nproc-per-node 4 b10_missing_allreduce_4ranks.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

STEPS = 200
CULPRIT = 1
BAD_STEP = 120


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
            continue  # drop the batch locally ... and with it this step's all_reduce
        stamp = torch.full((64,), float(step))  # every rank contributes its step index
        dist.all_reduce(stamp)  # <-- BUG: the culprit skips this call at step 120
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
