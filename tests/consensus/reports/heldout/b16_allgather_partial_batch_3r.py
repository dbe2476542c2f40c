# EXPECT: verdict=diverged culprit=2 line=21
# NPROC: 3
# SOURCE: https://github.com/NVIDIA/nccl/issues/1394
# SHAPE: Prediction gathering uses all_gather with output buffers shaped like the local tensor; with 11 eval samples and no padding rank 2 holds 3 predictions instead of 4, so its all_gather has a different size.
import datetime

import torch
import torch.distributed as dist

NUM_EVAL = 11
PER_RANK = 4


def local_predictions(rank):
    idx = list(range(rank * PER_RANK, min((rank + 1) * PER_RANK, NUM_EVAL)))
    return torch.tensor(idx, dtype=torch.float32) * 0.5


def gather_predictions(preds, world):
    buckets = [torch.empty_like(preds) for _ in range(world)]
    dist.all_gather(buckets, preds)  # BUG: tensor size differs on the last rank
    return torch.cat(buckets)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    preds = local_predictions(rank)
    everything = gather_predictions(preds, world)
    if rank == 0:
        print(f"gathered {everything.numel()} predictions: {everything.tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
