# EXPECT: verdict=diverged culprit=0 line=29
# NPROC: 2
# SOURCE: https://github.com/sgl-project/sglang/pull/26923
# SHAPE: A host-cache writing_check() returns early when this rank has no in-flight writes, skipping the all_reduce(MIN) that the other rank enters.
import datetime

import torch
import torch.distributed as dist


class HostCache:
    def __init__(self, rank, capacity):
        self.rank = rank
        self.capacity = capacity
        self.used = 0
        self.ongoing = {}

    def write_through(self, key, nbytes):
        if self.used + nbytes > self.capacity:
            return False  # host pool allocation failed on this rank
        self.used += nbytes
        self.ongoing[key] = nbytes
        return True

    def writing_check(self):
        if not self.ongoing:
            return 0  # BUG: early return skips the collective below
        finished = torch.tensor([len(self.ongoing)], dtype=torch.int64)
        dist.all_reduce(finished, op=dist.ReduceOp.MIN)
        n = int(finished.item())
        for key in list(self.ongoing)[:n]:
            self.used -= self.ongoing.pop(key)
        return n


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    # rank 0 runs with a smaller host pool, so one request does not fit
    cache = HostCache(rank, capacity=100 if rank == 0 else 1000)
    for step, size in enumerate([40, 30, 150, 20]):
        cache.write_through(f"req{step}", size)
        done = cache.writing_check()
        print(f"[rank{rank}] step {step}: released {done}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
