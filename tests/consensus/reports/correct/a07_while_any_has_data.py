# EXPECT: verdict=consistent
# SOURCE: facebookresearch/fairseq2 src/fairseq2/datasets/utils.py (_reduce_batch_size: gang-wide end-of-data check every step)
# SHAPE: the loop length depends on a rank-local iterator and the exhausted rank takes a different branch, which looks like a rank dropping out of the collective loop, but the continue/stop decision is all-reduced each step and the exhausted rank keeps issuing a zero-sized-contribution all_reduce.
# RUN: torchrun --standalone --nproc-per-node 3 a07_while_any_has_data.py
import datetime
import os
import sys

import torch
import torch.distributed as dist


def step(batch):
    # batch is None once this rank is exhausted; it still joins the collective
    if batch is None:
        stats = torch.zeros(2)
    else:
        stats = torch.tensor([batch.sum().item(), float(batch.numel())])
    dist.all_reduce(stats)
    return stats


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    it = iter([torch.ones(rank + 1) * k for k in range(2 + rank)])  # 2, 3, 4 batches

    grand = torch.zeros(2)
    rounds = 0
    while True:
        batch = next(it, None)
        alive = torch.tensor([0 if batch is None else 1])
        dist.all_reduce(alive)  # how many ranks still have data?
        if alive.item() == 0:
            break  # all ranks break in the same round
        grand += step(batch)
        rounds += 1

    assert rounds == 4 and grand[1].item() == 2 * 1 + 3 * 2 + 4 * 3, (rounds, grand)
    print(f"rank {rank}: rounds={rounds} sum={grand[0]:.0f} n={grand[1]:.0f}: OK", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
