# EXPECT: verdict=diverged culprit=1 line=23
# NPROC: 2
# SOURCE: https://github.com/facebookresearch/fairseq/pull/3989
# SHAPE: train_step wraps forward+all_reduce in try/except to "recover" from OOM; rank 1 raises on an oversized batch before the all_reduce and silently drops the step.
import datetime

import torch
import torch.distributed as dist

MAX_TOKENS = 64
stats = {"steps": 0, "oom": 0}


def forward(batch):
    if batch.numel() > MAX_TOKENS:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return batch.float().mean(0)


def train_step(batch, world):
    try:
        grad = forward(batch)
        dist.all_reduce(grad)
        return grad / world
    except RuntimeError as err:
        if "out of memory" in str(err):
            stats["oom"] += 1
            print(f"[rank{dist.get_rank()}] OOM, skipping batch")
            return None  # BUG: peers are already inside the all_reduce for this step
        raise
    finally:
        stats["steps"] += 1


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    lengths = [8, 8, 8, 8] if rank == 0 else [8, 8, 24, 8]  # rank 1 draws a long batch
    for n_rows in lengths:
        out = train_step(torch.ones(n_rows, 4), world)
        if out is not None:
            print(f"[rank{rank}] grad[0]={out[0].item():.2f}")
    print(f"[rank{rank}] stats={stats}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
