# EXPECT: verdict=diverged culprit=2 line=22
# NPROC: 4
# SOURCE: https://github.com/NVIDIA/nccl/issues/899
# SHAPE: A stale per-host override turns on overlap_grad_reduce for rank 2 only, which makes it issue the gradient all_reduce before the loss all_reduce, the reverse of every other rank.
import datetime

import torch
import torch.distributed as dist

DEFAULTS = {"overlap_grad_reduce": False, "lr": 0.1}
HOST_OVERRIDES = {2: {"overlap_grad_reduce": True}}  # leftover override file on one host


class Engine:
    def __init__(self, rank):
        self.rank = rank
        self.cfg = dict(DEFAULTS, **HOST_OVERRIDES.get(rank, {}))
        self.w = torch.zeros(6)

    def finish_step(self, loss, grad):
        if self.cfg["overlap_grad_reduce"]:
            dist.all_reduce(grad)  # BUG: order flipped by a rank-local config
            dist.all_reduce(loss)
        else:
            dist.all_reduce(loss)
            dist.all_reduce(grad)
        self.w -= self.cfg["lr"] * grad / dist.get_world_size()
        return loss.item() / dist.get_world_size()

    def step(self, i):
        x = torch.arange(6, dtype=torch.float32) * (self.rank + 1) + i
        grad = self.w - x
        loss = grad.pow(2).mean().reshape(1)
        return self.finish_step(loss, grad)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    engine = Engine(dist.get_rank())
    for i in range(3):
        avg = engine.step(i)
    print(f"[rank{engine.rank}] avg loss {avg:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
