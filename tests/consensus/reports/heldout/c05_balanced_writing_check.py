# EXPECT: verdict=consistent
# NPROC: 2
# SOURCE: https://github.com/uccl-project/uccl/pull/940
# SHAPE: writing_check() branches on whether this rank has in-flight writes, but both arms call the same all_reduce(MIN); an empty rank contributes 0 instead of returning early.
import datetime
import os
import sys

import torch
import torch.distributed as dist


class HostCache:
    def __init__(self, capacity):
        self.capacity, self.used, self.ongoing = capacity, 0, {}

    def write_through(self, key, nbytes):
        if self.used + nbytes > self.capacity:
            return False
        self.used += nbytes
        self.ongoing[key] = nbytes
        return True

    def writing_check(self):
        if not self.ongoing:
            finished = torch.zeros(1, dtype=torch.int64)
            dist.all_reduce(finished, op=dist.ReduceOp.MIN)  # empty rank still participates
            return 0
        else:
            finished = torch.tensor([len(self.ongoing)], dtype=torch.int64)
            dist.all_reduce(finished, op=dist.ReduceOp.MIN)
        n = int(finished.item())
        for key in list(self.ongoing)[:n]:
            self.used -= self.ongoing.pop(key)
        return n


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    cache = HostCache(capacity=100 if rank == 0 else 1000)
    released = 0
    for step, size in enumerate([40, 30, 150, 20, 10]):
        cache.write_through(f"req{step}", size)
        released += cache.writing_check()
    print(f"[rank{rank}] released {released}, still pending {len(cache.ongoing)}")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
