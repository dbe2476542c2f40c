# EXPECT: verdict=consistent
# NPROC: 2
# SOURCE: https://github.com/huggingface/accelerate/pull/238
# SHAPE: Every rank builds tensors whose values (and a rank-scaled learning signal) depend on the rank, but shapes, dtypes and the sequence of all_gather/all_reduce calls are identical.
import datetime
import os
import sys

import torch
import torch.distributed as dist


def local_stats(rank, step):
    scores = torch.linspace(0, 1, 6) * (rank + 1) + step
    hits = (scores > 1.5).to(torch.int64)
    return scores, hits


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    total_hits = torch.zeros(6, dtype=torch.int64)
    for step in range(3):
        scores, hits = local_stats(rank, step)
        gathered = [torch.empty_like(scores) for _ in range(world)]
        dist.all_gather(gathered, scores)
        dist.all_reduce(hits)
        total_hits += hits
        best = torch.stack(gathered).max(0).values
        if rank == 0:
            print(f"step {step}: best={best.tolist()}")
    print(f"[rank{rank}] hits={total_hits.tolist()}")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
