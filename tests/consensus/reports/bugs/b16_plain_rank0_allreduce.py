# EXPECT: verdict=diverged culprit=0 line=14
# KIND: extra
# SOURCE: https://github.com/Lightning-AI/pytorch-lightning/issues/16541
# SHAPE: the plainest divergence: only rank 0 calls all_reduce, then every rank calls barrier, so rank 0's all_reduce meets rank 1's barrier and both hang.
import datetime

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = torch.ones(1)
if dist.get_rank() == 0:
    # BUG: collective inside a rank-0-only branch
    dist.all_reduce(t)
dist.barrier()
print(f"[rank{dist.get_rank()}] t = {t.item()}", flush=True)
dist.destroy_process_group()
