# EXPECT: verdict=consistent
# NPROC: 2
# SOURCE: https://github.com/huggingface/transformers/pull/3800
# SHAPE: A torch_distributed_zero_first-style context manager: non-zero ranks barrier before the body, rank 0 barriers after it, so each rank calls barrier exactly once from different branches.
import contextlib
import datetime
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist


@contextlib.contextmanager
def zero_first(rank):
    if rank != 0:
        dist.barrier()  # wait until rank 0 has produced the cache
    try:
        yield
    finally:
        if rank == 0:
            dist.barrier()  # release the waiting ranks


def build_or_load(path, rank):
    if rank == 0:
        time.sleep(0.2)
        torch.save(torch.arange(10, dtype=torch.float32), path)
    return torch.load(path)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    path = os.path.join(tempfile.gettempdir(), f"heldout2_c09_{run_id}.pt")
    with zero_first(rank):
        data = build_or_load(path, rank)
    total = data.sum().reshape(1)
    dist.all_reduce(total)
    print(f"[rank{rank}] dataset sum across ranks: {total.item()}")
    dist.barrier()
    if rank == 0:
        os.remove(path)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
