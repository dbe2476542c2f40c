# EXPECT: verdict=hung culprit=1 line=19
# KIND: group
# SOURCE: https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.new_group ("requires that all processes in the main group ... enter this function"); https://github.com/radixark/miles/pull/2684 (collective set up under a single-rank guard deadlocks)
# SHAPE: only rank 1 turns on a "monitor" feature and creates a [0,1] process group for it; rank 0 never calls new_group, so rank 1 blocks inside new_group's rendezvous while rank 0 blocks in the next world all_reduce, and nobody ever reaches a collective on the monitor group.
# RUN: torchrun --standalone --nproc-per-node 2 b06_extra_new_group_hangs.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=60)


def maybe_setup_monitor(rank):
    enabled = rank == 1  # e.g. a per-host env flag that is only set on one node
    if enabled:
        return dist.new_group([0, 1], timeout=TIMEOUT)  # <-- BUG: only rank 1 creates this group
    return None


def main():
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank = dist.get_rank()
    monitor = maybe_setup_monitor(rank)
    loss = torch.tensor([1.0 + rank])
    dist.all_reduce(loss)  # rank 0 waits here forever
    print(f"rank {rank}: loss {loss.item():.1f} monitor={monitor is not None}", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
