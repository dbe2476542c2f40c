# EXPECT: verdict=diverged culprit=1 line=19
# NPROC: 2
# SOURCE: https://github.com/NVIDIA/apex/issues/19
# SHAPE: Metric tensors are reduced by iterating a dict whose insertion order depends on local data; rank 1's first sample is an ignored label, so it reduces the histogram before the loss.
import datetime

import torch
import torch.distributed as dist

IGNORE = -1
NUM_CLASSES = 5


def reduce_loss(t):
    dist.all_reduce(t)


def reduce_hist(t):
    dist.all_reduce(t)


REDUCERS = {"loss": reduce_loss, "hist": reduce_hist}  # intended order: loss, then hist


def accumulate(samples):
    metrics = {}
    for pred, label in samples:
        if label == IGNORE:
            metrics.setdefault("hist", torch.zeros(NUM_CLASSES))
            continue
        metrics.setdefault("loss", torch.zeros(1)).add_((pred - label) ** 2)
        metrics.setdefault("hist", torch.zeros(NUM_CLASSES))[label] += 1
    return metrics


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    shards = {0: [(1.0, 1), (2.5, 2), (0.2, 0)], 1: [(0.0, IGNORE), (3.1, 3), (4.0, 4)]}
    metrics = accumulate(shards[rank])
    for name, tensor in metrics.items():  # BUG: iteration order is data-dependent per rank
        REDUCERS[name](tensor)
    print(f"[rank{rank}] loss={metrics['loss'].item():.3f} hist={metrics['hist'].tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
