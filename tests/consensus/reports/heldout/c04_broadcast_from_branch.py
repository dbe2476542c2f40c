# EXPECT: verdict=consistent
# NPROC: 2
# SOURCE: https://github.com/meta-pytorch/tnt/pull/653
# SHAPE: Rank 0 reads the resume config inside `if rank == 0` and broadcasts it; the receivers call the matching broadcast_object_list in the else branch with a list of the agreed length.
import datetime
import os
import sys

import torch
import torch.distributed as dist


def read_resume_config():
    return {"start_epoch": 2, "lr": 0.03, "tags": ["resume", "ema"]}


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    if rank == 0:
        box = [read_resume_config()]
        dist.broadcast_object_list(box, src=0)
    else:
        box = [None]
        dist.broadcast_object_list(box, src=0)
    cfg = box[0]
    w = torch.zeros(3)
    if rank == 0:
        w = torch.tensor([1.0, 2.0, 3.0])  # only rank 0 loaded the weights
    dist.broadcast(w, src=0)
    for epoch in range(cfg["start_epoch"], 4):
        grad = w * (rank + 1)
        dist.all_reduce(grad)
        w -= cfg["lr"] * grad
    print(f"[rank{rank}] cfg={cfg} w={w.tolist()}")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
