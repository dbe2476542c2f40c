"""A prefetch IO thread all_reduces hit counts on its own gloo group while the
main thread runs the scheduler's collectives on the default group. On rank 0
the thread polls once more (a rank-local timing decision). Clean twin: PROG_FIX=1."""

import sys
import threading

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402

rank, world = init()
io_group = dist.new_group(list(range(world)))


def prefetch_io_loop():
    polls = 4 if rank == 0 and not fixed() else 3
    for _ in range(polls):
        dist.all_reduce(ones(1), op=dist.ReduceOp.MIN, group=io_group)  # SITE:io


thread = threading.Thread(target=prefetch_io_loop, name="prefetch-io")
thread.start()
for step in range(3):
    dist.all_reduce(ones(2))  # SITE:main
thread.join()
finish()
