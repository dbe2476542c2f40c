# EXPECT: verdict=consistent
# SOURCE: https://github.com/ecmwf/WeatherGenerator/issues/2724 and PR #2718 (loss-spike/NaN skip combined with all-reduce MAX so all ranks skip together)
# SHAPE: a rank-local NaN check guards a `continue` that skips the gradient all_reduce, which looks like one rank skipping a collective, but the flag is all-reduced with MAX first so every rank takes the same `continue`.
# RUN: torchrun --standalone --nproc-per-node 2 a13_skip_flag_agreed.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()

w = torch.zeros(3)
skipped = 0
for step in range(8):
    grad = torch.full((3,), float(step + rank))
    if rank == 1 and step in (2, 5):
        grad[0] = float("nan")  # only rank 1 sees a bad batch
    bad = torch.tensor([0.0 if torch.isfinite(grad).all() else 1.0])
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # agree first
    if bad.item() > 0:
        skipped += 1
        continue  # every rank skips this step together
    dist.all_reduce(grad)
    w -= 0.01 * grad / world

good_steps = [s for s in range(8) if s not in (2, 5)]
expected = -0.01 * sum(2 * s + 1 for s in good_steps) / world
assert skipped == 2 and torch.allclose(w, torch.full((3,), expected)), (skipped, w)
print(f"rank {rank}: skipped {skipped} steps together, w[0]={w[0]:.4f}: OK", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
