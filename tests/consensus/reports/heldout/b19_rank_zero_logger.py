# EXPECT: verdict=diverged culprit=0 line=30
# NPROC: 2
# SOURCE: https://github.com/talmolab/sleap-nn/pull/476
# SHAPE: An on_epoch_end logging callback is wrapped in a rank_zero_only decorator, but the metric it reads is computed lazily with an all_reduce, so only rank 0 runs that collective.
import datetime
import functools

import torch
import torch.distributed as dist


def rank_zero_only(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if dist.get_rank() == 0:
            return fn(*args, **kwargs)
    return wrapper


class EpochMetrics:
    def __init__(self):
        self.sum, self.count = torch.zeros(1), torch.zeros(1)

    def update(self, loss):
        self.sum += loss
        self.count += 1

    def compute(self):  # synchronised "callback_metrics"-style property
        t = torch.cat([self.sum, self.count])
        dist.all_reduce(t)
        return (t[0] / t[1]).item()


class CSVLogger:
    @rank_zero_only
    def on_epoch_end(self, epoch, metrics):
        print(f"epoch={epoch},loss={metrics.compute():.4f}")  # BUG: collective reached from rank 0 only


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    callbacks = [CSVLogger()]
    for epoch in range(2):
        metrics = EpochMetrics()
        for step in range(3):
            grad = torch.full((4,), float(step + rank))
            dist.all_reduce(grad)
            metrics.update(grad.mean().reshape(1))
        for cb in callbacks:
            cb.on_epoch_end(epoch, metrics)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
