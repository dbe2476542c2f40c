# EXPECT: verdict=diverged culprit=1 line=31
# KIND: extra
# SOURCE: https://github.com/Lightning-AI/pytorch-lightning/pull/19917
# SHAPE: rank 1 logs an extra "loss spike" metric with a same-shape all_reduce at one step; it silently pairs with rank 0's next per-step all_reduce (wrong means printed) and the run only dies at the final barrier.
import datetime

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
world = dist.get_world_size()

# Per-rank local losses for 6 steps; rank 1 sees one spike at step 2.
local_losses = {
    0: [0.90, 0.80, 0.70, 0.60, 0.50, 0.40],
    1: [0.95, 0.85, 3.00, 0.65, 0.55, 0.45],
}[rank]
SPIKE = 2.0

for step, loss in enumerate(local_losses):
    t = torch.tensor([loss])
    dist.all_reduce(t)
    print(f"[rank{rank}] step {step}: mean loss = {t.item() / world:.3f}", flush=True)

    if loss > SPIKE:
        # BUG: the spike check uses this rank's *local* loss, so only rank 1
        # enters this branch. Its all_reduce has the same shape as the
        # per-step one, so it pairs with rank 0's next step without an error.
        spike = torch.tensor([loss])
        dist.all_reduce(spike)
        print(f"[rank{rank}] logged spike {spike.item() / world:.3f}", flush=True)

# Rank 0 arrives here while rank 1 is still inside its last per-step all_reduce.
dist.barrier()
print(f"[rank{rank}] finished", flush=True)
dist.destroy_process_group()
