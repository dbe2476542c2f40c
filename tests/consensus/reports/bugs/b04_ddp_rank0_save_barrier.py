# EXPECT: verdict=diverged culprit=0 line=27
# KIND: op
# SOURCE: https://github.com/alan-turing-institute/autocast/pull/386
# SHAPE: Trainer.save_checkpoint() ends with a barrier, but it is only called under `if rank == 0`; rank 0's barrier meets rank 1's next DDP gradient all_reduce and the job hangs.
import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, rank):
        self.rank = rank
        torch.manual_seed(0)
        self.model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.ckpt = os.path.join(tempfile.gettempdir(), f"b04_ckpt_{os.getpid()}.pt")

    def save_checkpoint(self, step):
        torch.save({"step": step, "model": self.model.module.state_dict()}, self.ckpt)
        # BUG: "make everyone wait until the file is written" -- but this
        # method is only called by rank 0, so rank 1 never enters the barrier.
        dist.barrier()

    def fit(self, steps=8):
        g = torch.Generator().manual_seed(100 + self.rank)
        for step in range(steps):
            x = torch.randn(4, 8, generator=g)
            y = x.sum(dim=1, keepdim=True)
            loss = nn.functional.mse_loss(self.model(x), y)
            self.opt.zero_grad()
            loss.backward()  # DDP all_reduces gradients here
            self.opt.step()
            print(f"[rank{self.rank}] step {step} loss {loss.item():.4f}", flush=True)
            if self.rank == 0 and step % 3 == 2:
                self.save_checkpoint(step)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    trainer = Trainer(dist.get_rank())
    trainer.fit()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
