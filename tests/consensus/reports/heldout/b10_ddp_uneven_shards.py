# EXPECT: verdict=diverged culprit=0 line=31
# NPROC: 2
# SOURCE: https://github.com/k2-fsa/snowfall/issues/152
# SHAPE: A ceil-based manual partition gives rank 0 five samples and rank 1 four; under DDP rank 0's fifth backward issues a gradient all_reduce that rank 1 never joins.
import datetime
import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def partition(total, rank, world):
    per_partition = int(math.ceil(total / float(world)))
    start = rank * per_partition
    return range(start, min(start + per_partition, total))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = torch.randn(9, 5)
    targets = data.sum(1, keepdim=True)
    model = DDP(torch.nn.Linear(5, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for idx in partition(len(data), rank, world):
        opt.zero_grad()
        out = model(data[idx:idx + 1])
        loss = torch.nn.functional.mse_loss(out, targets[idx:idx + 1])
        loss.backward()  # gradient all_reduce happens here
        opt.step()
        print(f"[rank{rank}] sample {idx} loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
