"""Correct under every fault, with an output that follows rank 0's clock: rank 0 decides how
many steps fit a 0.6 s budget and broadcasts it, so every rank runs the same steps (no
divergence), and prints the count. A fast clock on rank 0 changes the printed count: what
--same-output checks, not the collectives."""

import sys
import time

import torch
import torch.distributed as dist
from common import done, init

rank = init()
start, steps = time.monotonic(), 0
while True:
    time.sleep(0.1)
    stop = torch.tensor([int(rank == 0 and time.monotonic() - start > 0.6)])
    dist.broadcast(stop, src=0)  # every rank follows rank 0's decision
    steps += 1
    if stop.item():
        break
if rank == 0:
    sys.stdout.write(f"result steps={steps}\n")  # one write: see common.done
    sys.stdout.flush()
done(steps)
