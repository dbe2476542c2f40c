# EXPECT: verdict=diverged culprit=1 line=23
# NPROC: 2
# SOURCE: https://github.com/Lightning-AI/pytorch-lightning/issues/19106
# SHAPE: A metrics logger syncs every logged key with all_reduce at epoch end; rank 1 logs an extra "grad_spike" key because its local grad norm crossed a threshold, so it runs one more all_reduce.
import datetime

import torch
import torch.distributed as dist


class SyncedLogger:
    def __init__(self, world):
        self.world = world
        self.buffer = {}

    def log(self, key, value):
        self.buffer.setdefault(key, []).append(float(value))

    def sync(self):
        out = {}
        for key in sorted(self.buffer):
            t = torch.tensor([sum(self.buffer[key]) / len(self.buffer[key])])
            dist.all_reduce(t)  # one collective per key; key set is rank-local
            out[key] = t.item() / self.world
        self.buffer.clear()
        return out


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    logger = SyncedLogger(world)
    g = torch.Generator().manual_seed(3)
    for epoch in range(2):
        for step in range(4):
            grad = torch.randn(8, generator=g) * (1.0 + 9.0 * (rank == 1 and epoch == 1 and step == 2))
            logger.log("loss", grad.abs().mean())
            gnorm = grad.norm().item()
            if gnorm > 10.0:
                logger.log("grad_spike", gnorm)  # BUG: threshold on a rank-local value adds a key
        metrics = logger.sync()
        print(f"[rank{rank}] epoch {epoch}: {metrics}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
