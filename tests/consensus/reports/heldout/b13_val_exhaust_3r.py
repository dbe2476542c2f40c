# EXPECT: verdict=diverged culprit=0 line=24
# NPROC: 3
# SOURCE: https://github.com/pytorch/torchtitan/issues/1618
# SHAPE: A validation loop iterates a strided shard to exhaustion (steps=-1); 10 samples over 3 ranks give rank 0 one extra batch whose loss all_reduce has no partner.
import datetime

import torch
import torch.distributed as dist

VAL_SET = [torch.full((2, 3), float(i)) for i in range(10)]


def val_batches(rank, world):
    for sample in VAL_SET[rank::world]:
        yield sample, sample.sum(1)


@torch.no_grad()
def validate(model, rank, world):
    total = torch.zeros(2)
    for x, y in val_batches(rank, world):
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y, reduction="sum")
        stat = torch.stack([loss, torch.tensor(float(len(y)))])
        dist.all_reduce(stat)
        total += stat
    return (total[0] / total[1]).item()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    print(f"[rank{rank}] val loss {validate(model, rank, world):.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
