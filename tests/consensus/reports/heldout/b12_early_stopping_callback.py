# EXPECT: verdict=diverged culprit=1 line=26
# NPROC: 2
# SOURCE: https://github.com/netket/netket/issues/651
# SHAPE: An EarlyStopping callback judges each rank's own validation loss; rank 1 plateaus and breaks out of the epoch loop while rank 0 starts another epoch of gradient all_reduces.
import datetime

import torch
import torch.distributed as dist


class EarlyStopping:
    def __init__(self, patience=1):
        self.patience, self.best, self.bad = patience, float("inf"), 0

    def on_epoch_end(self, val_loss):
        if val_loss < self.best - 1e-6:
            self.best, self.bad = val_loss, 0
        else:
            self.bad += 1
        return self.bad > self.patience


def train_epoch(w, epoch, n_batches=3):
    for b in range(n_batches):
        grad = torch.full_like(w, 0.1 * (epoch + b + 1))
        dist.all_reduce(grad)
        w -= 0.01 * grad
    return w


def local_val_loss(rank, epoch):
    # rank 1's validation shard stops improving after epoch 1
    return 1.0 / (epoch + 1) if rank == 0 else [0.9, 0.5, 0.5, 0.5, 0.5, 0.5][epoch]


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    w, stopper = torch.ones(4), EarlyStopping(patience=1)
    for epoch in range(6):
        w = train_epoch(w, epoch)
        if stopper.on_epoch_end(local_val_loss(rank, epoch)):
            print(f"[rank{rank}] early stop at epoch {epoch}")
            break  # BUG: local verdict, no broadcast/all_reduce of the stop flag
    print(f"[rank{rank}] w={w.tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
