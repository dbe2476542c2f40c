"""PyTorch's Flight Recorder tutorial example (crash.py), on gloo: two all_reduces of a 3x4
tensor, then rank 0 alone all_reduces a tensor `b`, then two more 3x4 all_reduces. Two changes
so that gloo leaves dumps: `b` is 4x3 (the tutorial's 4x5 makes gloo abort the receiving rank
in its size check at once; NCCL checks no sizes, so there the calls pair and time out), and
each rank writes its buffer when it leaves (NCCL's watchdog dumps on the timeout; gloo does
not) to $TORCH_FR_DUMP_TEMP_FILE<rank>."""

import datetime
import os

import torch
import torch.distributed as dist

rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
try:
    a = torch.full((3, 4), float(rank))
    for i in range(2):
        dist.all_reduce(a)
    if rank == 0:  # rank 0 does an additional collective
        b = torch.full((4, 3), float(rank))
        dist.all_reduce(b)  # SITE:extra
    for i in range(2):
        dist.all_reduce(a)
finally:
    dump = torch._C._distributed_c10d._dump_fr_trace()
    with open(f"{os.environ['TORCH_FR_DUMP_TEMP_FILE']}{rank}", "wb") as f:
        f.write(dump)
