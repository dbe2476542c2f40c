# EXPECT: verdict=diverged culprit=0 line=25
# KIND: extra
# SOURCE: https://pytorch.org/tutorials/prototype/flight_recorder_tutorial.html
# SHAPE: the Flight Recorder tutorial's crash.py on gloo/CPU: two all_reduces on a 3x4 tensor, then rank 0 alone all_reduces a 4x5 tensor, then two more 3x4 all_reduces; rank 0's extra call meets rank 1's 3x4 all_reduce.
import datetime
import os

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
world_size = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", world_size=world_size, rank=local_rank,
                        timeout=datetime.timedelta(seconds=60))

a = torch.full((3, 4), float(local_rank))
for i in range(2):
    print(f"[rank{local_rank}] all_reduce #{i} on a", flush=True)
    dist.all_reduce(a)

if local_rank == 0:
    # BUG: rank 0 does an additional collective that other ranks never issue
    print("[rank0] extra all_reduce on b (no other rank issues this)", flush=True)
    b = torch.full((4, 5), float(local_rank))
    dist.all_reduce(b)

for i in range(2):
    print(f"[rank{local_rank}] all_reduce #{i} on a", flush=True)
    dist.all_reduce(a)

print(f"[rank{local_rank}] exiting", flush=True)
dist.destroy_process_group()
