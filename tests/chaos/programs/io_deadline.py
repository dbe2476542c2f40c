"""A per-step read of a local shard with a deadline: when this rank's read takes longer than
30 ms it broadcasts a "resync" from itself before the step's sync (a fallback decided from
rank-local I/O timing). The file is small and cached, so reads take well under 1 ms on every
rank, until one rank's file I/O is slow (io-delay): it broadcasts alone."""

import os
import tempfile
import time

import torch
import torch.distributed as dist

from common import done, init

rank = init()
shard = os.path.join(tempfile.gettempdir(), f"hctool-io-deadline-{os.getpid()}.bin")
with open(shard, "wb") as f:
    f.write(os.urandom(4096))
steps = 0
for _ in range(10):
    t0 = time.perf_counter()
    with open(shard, "rb") as f:
        data = f.read()
    if time.perf_counter() - t0 > 0.03:     # rank-local: this rank's I/O time
        dist.broadcast(torch.zeros(2), src=rank)
    dist.all_reduce(torch.tensor([float(len(data))]))
    steps += 1
    time.sleep(0.1)
os.unlink(shard)
dist.barrier()
done(steps)
