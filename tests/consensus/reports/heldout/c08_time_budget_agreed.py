# EXPECT: verdict=consistent
# NPROC: 2
# SOURCE: https://github.com/NVIDIA-NeMo/Automodel/pull/3007
# SHAPE: Ranks compute at very different speeds and each tracks its own compute time, but the "out of budget" flag is all_reduced with MAX each step, so all ranks exit the while-loop together.
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

BUDGET_S = 1.0


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    compute_s, step = 0.0, 0
    acc = torch.zeros(16)
    while True:
        t0 = time.perf_counter()
        time.sleep(0.08 if rank == 0 else 0.3)  # uneven per-rank speed
        grad = torch.full((16,), float(step))
        compute_s += time.perf_counter() - t0
        dist.all_reduce(grad)
        acc += grad
        step += 1
        over = torch.tensor([1.0 if compute_s >= BUDGET_S else 0.0])
        dist.all_reduce(over, op=dist.ReduceOp.MAX)  # stop if any rank is out of budget
        if over.item() > 0:
            break
    print(f"[rank{rank}] stopped after {step} steps ({compute_s:.2f}s local compute)")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
