"""An admission loop whose budget is a pool's free count that a background completion thread
refills (the shape of SGLang #30760): each step admits work while the pool has a free slot,
with one vote (all_reduce) per admitted item. The completion thread returns each slot ~5 ms
after the step, well inside the 150 ms step, so every rank admits the same number, until the
completion thread runs late on one rank (thread-slow): it admits fewer and votes fewer times."""

import queue
import threading
import time

import torch
import torch.distributed as dist

from common import done, init

SLOTS = 4


class Pool:
    def __init__(self, n):
        self.free = n
        self.lock = threading.Lock()
        self.completions: queue.Queue = queue.Queue()
        threading.Thread(target=self._complete, name="completion", daemon=True).start()

    def take(self) -> bool:
        with self.lock:
            if self.free == 0:
                return False
            self.free -= 1
            return True

    def finish_later(self):
        self.completions.put(time.monotonic())

    def _complete(self):
        while True:
            self.completions.get()
            time.sleep(0.005)  # the item's work
            with self.lock:
                self.free += 1


init()
pool = Pool(SLOTS)
votes = 0
for step in range(10):
    admitted = 0
    while pool.take():                      # rank-local: this rank's free count
        dist.all_reduce(torch.ones(1))      # one vote per admitted item
        admitted += 1
        votes += 1
    for _ in range(admitted):
        pool.finish_later()
    time.sleep(0.15)                        # the batch runs
dist.barrier()
done(votes)
