"""A rank-0-only sender branch: rank 0 publishes the run's config with
broadcast_object_list from one function, the others receive it with the same
call from another. The two lines pair by design. Misuse (the default): rank 0
publishes once more when its own copy of the config file changed (a rank-local
check), a call no peer makes. Correct program: PROG_FIX=1."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402

rank, world = init()


def publish(cfg: dict) -> dict:
    dist.broadcast_object_list([cfg], src=0)  # SITE:send
    return cfg


def subscribe() -> dict:
    box = [None]
    dist.broadcast_object_list(box, src=0)  # SITE:recv
    return box[0]


def local_file_changed(step: int) -> bool:
    return rank == 0 and step == 1 and not fixed()  # rank-local: this host's file mtime


for step in range(3):
    cfg = publish({"step": step, "lr": 0.1}) if rank == 0 else subscribe()
    if local_file_changed(step):
        publish({"step": step, "lr": 0.2})  # SITE:republish
    dist.all_reduce(ones(2))  # SITE:sync
finish()
