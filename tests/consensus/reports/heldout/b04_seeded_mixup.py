# EXPECT: verdict=diverged culprit=1 line=22
# NPROC: 2
# SOURCE: https://github.com/Lightning-AI/pytorch-lightning/issues/9851
# SHAPE: Augmentation RNG is seeded with seed+rank, so the "apply mixup" coin flip differs per rank; the mixup branch all_reduces its lambda statistics, and only rank 1 flips heads.
import datetime

import torch
import torch.distributed as dist

SEED = 67
MIXUP_P = 0.15


def batches(rank, n):
    for i in range(n):
        yield torch.full((4, 3), float(i + rank)), torch.tensor([i % 3] * 4)


def mixup(x, rng):
    lam = torch.rand(1, generator=rng)
    stats = torch.cat([lam, lam * lam])
    dist.all_reduce(stats)  # BUG: only reached on ranks whose local coin came up heads
    return lam * x + (1 - lam) * x.flip(0), stats


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    aug_rng = torch.Generator().manual_seed(SEED + rank)  # per-rank augmentation stream
    w = torch.zeros(3)
    for step, (x, y) in enumerate(batches(rank, 6)):
        if torch.rand(1, generator=aug_rng).item() < MIXUP_P:
            x, stats = mixup(x, aug_rng)
            print(f"[rank{rank}] step {step}: mixup, mean lam {stats[0].item():.3f}")
        grad = x.mean(0) - w
        dist.all_reduce(grad)
        w += 0.1 * grad
    print(f"[rank{rank}] w={w.tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
