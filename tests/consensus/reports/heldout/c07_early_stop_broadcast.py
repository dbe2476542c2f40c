# EXPECT: verdict=consistent
# NPROC: 2
# SOURCE: https://github.com/ultralytics/yolov5/pull/8345
# SHAPE: A while-loop trainer where only rank 0 evaluates the EarlyStopping rule, then broadcasts the stop flag every epoch so every rank leaves the loop at the same iteration.
import datetime
import os
import sys

import torch
import torch.distributed as dist


class EarlyStopping:
    def __init__(self, patience=1):
        self.best, self.bad, self.patience = float("inf"), 0, patience

    def __call__(self, metric):
        if metric < self.best:
            self.best, self.bad = metric, 0
        else:
            self.bad += 1
        return self.bad > self.patience


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    stopper = EarlyStopping(patience=1) if rank == 0 else None
    val_curve = [0.9, 0.6, 0.5, 0.55, 0.56, 0.4, 0.3]
    w, epoch, stop = torch.ones(4), 0, False
    while not stop:
        grad = torch.full((4,), 0.1 * (epoch + 1 + rank))
        dist.all_reduce(grad)
        w -= 0.05 * grad
        flag = [stopper(val_curve[epoch]) if rank == 0 else None]
        dist.broadcast_object_list(flag, src=0)
        stop = flag[0] or epoch == len(val_curve) - 1
        epoch += 1
    print(f"[rank{rank}] stopped after {epoch} epochs, w={w.tolist()}")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
