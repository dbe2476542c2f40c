# EXPECT: verdict=diverged culprit=1 line=36
# NPROC: 2
# SOURCE: https://github.com/NVIDIA-NeMo/Automodel/pull/2468
# SHAPE: In an epoch/batch loop with manual gradient averaging, rank 1 meets a NaN sample and `continue`s past the gradient all_reduce on its own.
import datetime
import math

import torch
import torch.distributed as dist


def make_shard(rank):
    g = torch.Generator().manual_seed(100 + rank)
    xs = [torch.randn(4, 3, generator=g) for _ in range(4)]
    if rank == 1:
        xs[2][1, 0] = math.nan  # corrupt sample in rank 1's shard
    return [(x, x.sum(1, keepdim=True)) for x in xs]


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    shard = make_shard(rank)
    for epoch in range(2):
        for i, (x, y) in enumerate(shard):
            loss = torch.nn.functional.mse_loss(model(x), y)
            if not torch.isfinite(loss):
                print(f"[rank{rank}] epoch {epoch} batch {i}: non-finite loss, skipping")
                continue  # BUG: skip decided locally, peers still reduce
            opt.zero_grad()
            loss.backward()
            flat = torch.cat([p.grad.flatten() for p in model.parameters()])
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for p in model.parameters():
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            opt.step()
        print(f"[rank{rank}] epoch {epoch} done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
