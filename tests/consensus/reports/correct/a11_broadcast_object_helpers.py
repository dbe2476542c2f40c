# EXPECT: verdict=consistent
# SOURCE: https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.broadcast_object_list (src fills the list, others pass placeholders)
# SHAPE: rank 0 calls broadcast_object_list inside publish_config() and the other ranks call it inside receive_config(), two different helpers and lines, but it is one broadcast from src=0 with a one-element list on every rank.
# RUN: torchrun --standalone --nproc-per-node 3 a11_broadcast_object_helpers.py
import datetime
import os
import sys

import torch.distributed as dist


def publish_config(cfg):
    box = [cfg]
    dist.broadcast_object_list(box, src=0)  # rank 0: sender side
    return box[0]


def receive_config():
    box = [None]
    dist.broadcast_object_list(box, src=0)  # other ranks: receiver side
    return box[0]


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    if rank == 0:
        cfg = publish_config({"lr": 3e-4, "run": "c31", "layers": [64, 64, 10]})
    else:
        cfg = receive_config()
    assert cfg["layers"] == [64, 64, 10] and cfg["run"] == "c31", cfg
    print(f"rank {rank}: config {cfg}: OK", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
