# EXPECT: verdict=consistent
# SOURCE: https://github.com/NVIDIA/nccl/issues/479 (send/send ordering deadlocks only when blocking); https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.isend
# SHAPE: both ranks post their send to the peer before their receive, the textbook send/send deadlock shape, but the sends are isend (non-blocking) and both requests are waited only after the irecv is posted, so the exchange completes.
# RUN: torchrun --standalone --nproc-per-node 2 a19_isend_first_exchange.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
peer = 1 - rank
halo_out = torch.full((2 << 20,), float(rank))  # 8 MiB boundary slab
halo_in = torch.empty_like(halo_out)

for sweep in range(3):
    s = dist.isend(halo_out, dst=peer)  # send first on BOTH ranks ...
    r = dist.irecv(halo_in, src=peer)  # ... but non-blocking, so recv gets posted
    s.wait()
    r.wait()
    halo_out += 1

assert halo_in[0].item() == peer + 2, halo_in[0]
print(f"rank {rank}: received halo {halo_in[0].item():.0f} from rank {peer}: OK", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
