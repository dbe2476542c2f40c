"""A steady scheduler: rank 0 broadcasts a small object ~50 times per second
for TICKER_SECONDS; every rank agrees."""

import os
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import finish, init  # noqa: E402

rank, world = init()
end = time.monotonic() + float(os.environ.get("TICKER_SECONDS", "3"))
tick = 0
while True:
    box = [("tick", tick, time.monotonic() < end)] if rank == 0 else [None]
    dist.broadcast_object_list(box, src=0)  # SITE:tick
    if not box[0][2]:
        break
    tick += 1
    time.sleep(0.02)
finish()
