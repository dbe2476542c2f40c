# EXPECT: verdict=diverged culprit=1 line=20
# KIND: group
# SOURCE: https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.new_group (every rank must call new_group, in the same order); pytorch/pytorch distributed_c10d.py _process_group_name (non-hashed group names come from a per-process call counter)
# SHAPE: rank 1 alone creates a private single-member group (which succeeds immediately), which silently advances its group-name counter, so the next new_group([0,1]) that both ranks call gets a different name on each rank and hangs; the culprit is the extra call, not the later matching-looking one.
# RUN: torchrun --standalone --nproc-per-node 2 b07_extra_single_rank_group_shifts_names.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=60)

dist.init_process_group("gloo", timeout=TIMEOUT)
rank = dist.get_rank()

if rank == 1:
    # a "local" group just for this rank's async checkpoint writer
    ckpt_group = dist.new_group([1], timeout=TIMEOUT)  # <-- BUG: extra new_group on rank 1 only

dp_group = dist.new_group([0, 1], timeout=TIMEOUT)  # both ranks call this, but under different names
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t, group=dp_group)
print(f"rank {rank}: dp sum {t.item():.0f}", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
