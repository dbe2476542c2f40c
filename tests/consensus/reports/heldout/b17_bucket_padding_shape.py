# EXPECT: verdict=diverged culprit=1 line=24
# NPROC: 2
# SOURCE: https://github.com/EleutherAI/bergson/pull/227
# SHAPE: Batches are padded to a length bucket chosen from the local longest sequence; rank 1 has one long sample, pads to 32 instead of 16, and all_reduces a differently sized per-position token count.
import datetime

import torch
import torch.distributed as dist

BUCKET = 16


def collate(seqs):
    longest = max(len(s) for s in seqs)
    target = BUCKET if longest <= BUCKET else 2 * BUCKET  # BUG: bucket chosen from local data
    batch = torch.zeros(len(seqs), target)
    for i, s in enumerate(seqs):
        batch[i, :len(s)] = torch.tensor(s, dtype=torch.float32)
    return batch


def position_counts(batch):
    counts = (batch != 0).sum(0).float()
    dist.all_reduce(counts)
    return counts


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    lengths = [[5, 9, 12], [7, 11, 14]] if rank == 0 else [[6, 10, 3], [8, 20, 4]]
    for step, lens in enumerate(lengths):
        batch = collate([[1] * n for n in lens])
        counts = position_counts(batch)
        print(f"[rank{rank}] step {step}: {int(counts.sum().item())} tokens across ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
