# EXPECT: verdict=diverged culprit=1 line=34
# KIND: missing
# SOURCE: https://github.com/pytorch/pytorch/issues/22834
# SHAPE: each rank stops training when its own wall-clock budget is spent; rank 1's data loading is slower, so it reads its clock later in each step, breaks one step earlier and skips that step's all_reduce, leaving rank 0 waiting while rank 1 sits in the final barrier.
import datetime
import time

import torch
import torch.distributed as dist

BUDGET_S = 1.25


def load_batch(rank, step):
    time.sleep(0.50 if rank == 1 else 0.01)  # rank 1 reads from slow storage
    return torch.full((4,), float(step + rank))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    dist.barrier()
    start = time.monotonic()
    steps_done = 0
    for step in range(20):
        batch = load_batch(rank, step)
        if time.monotonic() - start > BUDGET_S:
            # BUG: rank-local time budget; rank 1 exceeds it at step 2 while
            # rank 0 is still under budget and goes on to the all_reduce.
            print(f"[rank{rank}] time budget exhausted at step {step} "
                  f"({time.monotonic() - start:.2f}s > {BUDGET_S}s)", flush=True)
            break
        loss = batch.mean().reshape(1)
        dist.all_reduce(loss)
        steps_done += 1
        print(f"[rank{rank}] step {step} global loss {loss.item():.2f}", flush=True)
    dist.barrier()
    print(f"[rank{rank}] done after {steps_done} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
