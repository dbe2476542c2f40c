# EXPECT: verdict=diverged culprit=0 line=28
# KIND: missing
# SOURCE: https://github.com/Lightning-AI/pytorch-lightning/pull/19918
# SHAPE: an eval loop with one all_reduce per batch; rank 0 filters a batch down to nothing and `continue`s, so its counts pair with rank 1's next batch and at the end rank 1's leftover all_reduce meets rank 0's final all_gather.
import datetime

import torch
import torch.distributed as dist


def load_batches(rank):
    g = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, 10, (4,), generator=g) for _ in range(5)]
    if rank == 0:
        batches[2] = torch.tensor([-1, -1, -1, -1])  # all padding after filtering
    return batches


def evaluate(rank):
    correct = 0.0
    for i, batch in enumerate(load_batches(rank)):
        batch = batch[batch >= 0]
        if batch.numel() == 0:
            # BUG: skipping an empty batch is local to rank 0; rank 1 still
            # all_reduces its count for batch i.
            continue
        hits = torch.tensor([float((batch % 2 == 0).sum())])
        dist.all_reduce(hits)
        correct += hits.item()
        print(f"[rank{rank}] batch {i}: global hits {hits.item():.0f}", flush=True)
    return correct


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    correct = evaluate(rank)
    per_rank = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(per_rank, torch.tensor([correct]))
    print(f"[rank{rank}] per-rank totals {[t.item() for t in per_rank]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
