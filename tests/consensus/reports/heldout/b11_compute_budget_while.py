# EXPECT: verdict=diverged culprit=1 line=28
# NPROC: 2
# SOURCE: https://github.com/facebookresearch/fairseq/pull/2333
# SHAPE: A while-loop trains until the rank-local compute time exceeds a budget; rank 1 computes slower and leaves the loop after 4 steps while rank 0 keeps reducing.
import datetime
import time

import torch
import torch.distributed as dist

BUDGET_S = 1.0


def local_compute(rank, step):
    time.sleep(0.08 if rank == 0 else 0.3)  # rank 1 sits on a throttled host
    return torch.full((16,), float(step))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    compute_s, step = 0.0, 0
    acc = torch.zeros(16)
    while compute_s < BUDGET_S:  # BUG: stop condition is never agreed across ranks
        t0 = time.perf_counter()
        grad = local_compute(rank, step)
        compute_s += time.perf_counter() - t0
        dist.all_reduce(grad)
        acc += grad
        step += 1
    print(f"[rank{rank}] stopped after {step} steps ({compute_s:.2f}s compute)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
