# EXPECT: verdict=consistent
# SOURCE: ultralytics/yolov5 utils/torch_utils.py torch_distributed_zero_first; wutong4012/Self-Consistent-Learning system/utils.py (same idiom)
# SHAPE: ranks 1..N-1 hit `dist.barrier()` at the top while rank 0 hits a different `dist.barrier()` at the bottom, so the barrier calls come from different lines on different ranks, yet every rank issues exactly one barrier.
# RUN: torchrun --standalone --nproc-per-node 3 a04_rank0_first_inline.py
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
local_rank = int(os.environ.get("LOCAL_RANK", -1))
world = dist.get_world_size()

# "download" the dataset on local rank 0 only; the others wait, then read it
store = dist.distributed_c10d._get_default_store()
if local_rank not in (-1, 0):
    dist.barrier()
if local_rank in (-1, 0):
    time.sleep(0.3)  # slow download
    store.set("dataset_ready", "mnist-v1")
data_tag = store.get("dataset_ready").decode()  # never blocks: the key exists by now
if local_rank == 0:
    dist.barrier()

n = torch.tensor([len(data_tag)])
dist.all_reduce(n)
assert n.item() == world * len("mnist-v1")
print(f"rank {local_rank}: got {data_tag}, check {n.item()}: OK", flush=True)

dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
