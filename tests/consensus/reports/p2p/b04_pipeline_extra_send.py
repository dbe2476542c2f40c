# EXPECT: verdict=diverged culprit=0 line=21
# KIND: extra
# SOURCE: https://github.com/pytorch/torchtitan/issues/775 (PP hangs when stages disagree on the number of micro-batches); https://github.com/pytorch/pytorch/pull/11275 (every send must be matched with a recv)
# SHAPE: stage 0 sends its M micro-batches and then one extra end-of-stream sentinel, but stage 1 already knows M and receives exactly M, so the sentinel send on rank 0 has no matching recv and blocks while rank 1 waits in the final barrier.
# RUN: torchrun --standalone --nproc-per-node 2 b04_pipeline_extra_send.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

M, N = 4, 1 << 18

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()

if rank == 0:  # first stage
    for mb in range(M):
        dist.send(torch.full((N,), float(mb)), dst=1)
    dist.send(torch.full((N,), -1.0), dst=1)  # <-- BUG: extra "end of stream" send; stage 1 never receives it
else:  # last stage
    total = 0.0
    buf = torch.empty(N)
    for mb in range(M):  # stage 1 receives exactly M micro-batches
        dist.recv(buf, src=0)
        total += buf[0].item()
    print(f"rank 1: received {M} micro-batches, sum {total:.0f}", flush=True)

dist.barrier()  # rank 1 waits here, rank 0 is still stuck in the sentinel send
print(f"rank {rank}: done", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
