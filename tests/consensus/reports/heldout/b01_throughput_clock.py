# EXPECT: verdict=diverged culprit=1 line=32
# NPROC: 2
# SOURCE: https://github.com/pytorch/pytorch/issues/22834
# SHAPE: A trainer logs global throughput whenever its own accumulated data-loading time passes a threshold; only the slow-loader rank's timer fires, so it issues an extra all_reduce.
import datetime
import time

import torch
import torch.distributed as dist


class Trainer:
    def __init__(self, rank, world, log_every_s=1.0):
        self.rank, self.world = rank, world
        self.log_every_s = log_every_s
        self.data_time = 0.0
        self.samples_since_log = 0
        self.w = torch.zeros(8)

    def load_batch(self, step):
        t0 = time.perf_counter()
        # rank 1 reads its shard from a slow network mount
        time.sleep(0.05 if self.rank == 0 else 0.3)
        self.data_time += time.perf_counter() - t0
        return torch.full((8,), float(step + self.rank))

    def maybe_log_throughput(self):
        if self.data_time < self.log_every_s:
            return
        # BUG: the decision uses this rank's own clock, the other rank never gets here
        total = torch.tensor([float(self.samples_since_log)])
        dist.all_reduce(total)
        print(f"[rank{self.rank}] global samples since last log: {total.item():.0f}")
        self.data_time = 0.0
        self.samples_since_log = 0

    def train_step(self, step):
        grad = self.load_batch(step) - self.w
        dist.all_reduce(grad)
        self.w += 0.1 * grad / self.world
        self.samples_since_log += 8
        self.maybe_log_throughput()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    trainer = Trainer(dist.get_rank(), dist.get_world_size())
    for step in range(6):
        trainer.train_step(step)
    print(f"[rank{trainer.rank}] done, w[0]={trainer.w[0].item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
