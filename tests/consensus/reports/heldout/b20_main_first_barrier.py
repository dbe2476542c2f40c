# EXPECT: verdict=diverged culprit=0 line=20
# NPROC: 2
# SOURCE: https://github.com/huggingface/transformers-bloom-inference/pull/40
# SHAPE: A hand-written "main process first" context manager puts the release barrier inside the rank-0 branch, so only rank 0 calls barrier while rank 1 goes straight on to the weight broadcast.
import contextlib
import datetime
import time

import torch
import torch.distributed as dist


@contextlib.contextmanager
def main_process_first(rank):
    try:
        yield
    finally:
        if rank == 0:
            print("rank 0: download finished, releasing others")
            dist.barrier()  # BUG: non-zero ranks never enter a matching barrier


def download_weights(rank):
    if rank == 0:
        time.sleep(0.2)  # fetch from the hub
    return torch.arange(8, dtype=torch.float32)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    with main_process_first(rank):
        weights = download_weights(rank)
    dist.broadcast(weights, src=0)
    print(f"[rank{rank}] weights ready: {weights.sum().item()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
