# EXPECT: verdict=diverged culprit=1 line=26
# KIND: extra
# SOURCE: https://github.com/Lightning-AI/pytorch-lightning/issues/6286
# SHAPE: maybe_checkpoint() barriers when the rank's own time.monotonic() says the interval has passed; rank 1 is slower per step and checks its clock later in the step, so its barrier fires one step before rank 0's and meets rank 0's per-step all_reduce.
import datetime
import time

import torch
import torch.distributed as dist


class Checkpointer:
    def __init__(self, rank, interval_s):
        self.rank = rank
        self.interval_s = interval_s
        self.last = time.monotonic()

    def maybe_checkpoint(self, step):
        now = time.monotonic()
        if now - self.last >= self.interval_s:
            print(f"[rank{self.rank}] step {step}: {now - self.last:.2f}s since last checkpoint",
                  flush=True)
            # BUG: the decision comes from this rank's own clock. Rank 1 reaches
            # this check ~0.5 s later in every step than rank 0, so it crosses
            # the interval one step earlier and enters the barrier alone.
            dist.barrier()
            self.last = now
            print(f"[rank{self.rank}] checkpoint at step {step}", flush=True)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    work_s = 0.50 if rank == 1 else 0.01  # rank 1 is the slow rank
    dist.barrier()  # start both clocks together
    ckpt = Checkpointer(rank, interval_s=1.25)
    for step in range(8):
        time.sleep(work_s)  # forward/backward
        ckpt.maybe_checkpoint(step)
        t = torch.tensor([float(step)])
        dist.all_reduce(t)
        print(f"[rank{rank}] step {step} reduced {t.item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
