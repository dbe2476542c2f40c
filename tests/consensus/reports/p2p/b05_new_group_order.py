# EXPECT: verdict=diverged culprit=1 line=23
# KIND: group
# SOURCE: https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.new_group ("all processes in the main group ... must call new_group in the same order"); https://github.com/distdl/distdl/issues/87 (group creation can deadlock)
# SHAPE: the intended order creates the pipeline link groups by link index ([0,1] then [1,2]), but each rank builds "the link that starts at me" first, which reorders the calls only on rank 1 (it creates [1,2] before [0,1]); new_group names groups by a call counter, so the groups' rendezvous keys no longer line up and new_group hangs before the link all_reduce is reached.
# RUN: torchrun --standalone --nproc-per-node 3 b05_new_group_order.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=60)

dist.init_process_group("gloo", timeout=TIMEOUT)
rank = dist.get_rank()

links = [[0, 1], [1, 2]]  # intended creation order: by link index
# "create my outgoing link first" -- stable sort, so only rank 1's order changes
order = sorted(links, key=lambda link: link[0] != rank)
groups = {}
for link in order:
    groups[tuple(link)] = dist.new_group(link, timeout=TIMEOUT)  # <-- BUG: rank 1 calls this for [1,2] first

t = torch.tensor([float(rank)])
if rank in (0, 1):
    dist.all_reduce(t, group=groups[(0, 1)])
print(f"rank {rank}: link sum {t.item():.0f}", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
