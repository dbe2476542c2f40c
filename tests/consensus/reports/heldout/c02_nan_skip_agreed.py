# EXPECT: verdict=consistent
# NPROC: 2
# SOURCE: https://github.com/ecmwf/WeatherGenerator/issues/2724
# SHAPE: Each rank checks its own loss for NaN, but the skip flag is combined with all_reduce(MAX) before anyone branches, so all ranks skip (continue) or step together.
import datetime
import math
import os
import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(10 + rank)
    skipped = 0
    for epoch in range(2):
        for i in range(4):
            x = torch.randn(4, 3, generator=g)
            if rank == 1 and i == 2:
                x[0, 0] = math.nan  # local corruption, only on rank 1
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            bad = torch.tensor([0.0 if torch.isfinite(loss) else 1.0])
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # global decision
            if bad.item() > 0:
                skipped += 1
                continue  # every rank takes this branch together
            opt.zero_grad()
            loss.backward()
            flat = torch.cat([p.grad.flatten() for p in model.parameters()])
            dist.all_reduce(flat)
            flat /= world
            off = 0
            for p in model.parameters():
                p.grad.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()
            opt.step()
    print(f"[rank{rank}] skipped {skipped} steps, w={model.weight.data.flatten().tolist()}")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
