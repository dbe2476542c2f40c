"""A flag set by a background loader thread, read before a collective: each step the main
thread syncs a batch only `if loader.ready.is_set()`, and the loader refills the flag within
~10 ms of a 150 ms step, so every rank always finds it set, until the loader runs late on one
rank (thread-slow): that rank skips a sync its peers make."""

import queue
import threading
import time

import torch
import torch.distributed as dist

from common import done, init


class Loader(threading.Thread):
    def __init__(self):
        super().__init__(name="batch-loader", daemon=True)
        self.batches: queue.Queue = queue.Queue(maxsize=2)
        self.ready = threading.Event()

    def run(self):
        while True:
            self.batches.put(torch.ones(8))   # blocks while two batches wait
            self.ready.set()
            time.sleep(0.005)


init()
loader = Loader()
loader.start()
time.sleep(0.1)
steps = 0
for _ in range(12):
    time.sleep(0.15)                        # compute
    if loader.ready.is_set():               # rank-local: this rank's loader thread
        batch = loader.batches.get(timeout=5)
        if loader.batches.empty():
            loader.ready.clear()
        dist.all_reduce(batch)
        steps += 1
dist.barrier()
done(steps)
