"""A world of one that records a few calls, one of them through the public
record_collective entry from a helper thread attributed to a frame of the
main thread's (as a capture route on autograd's thread does), then SIGKILLs itself: the trace must hold every call."""

import datetime
import os
import signal
import tempfile
import threading

import torch
import torch.distributed as dist

from hctool.agent.capture import recorder

dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=30))
t = torch.ones(3)
for _ in range(3):
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # SITE:loop
dist.broadcast(t, src=0)  # SITE:bcast
sub = dist.new_group([0])
dist.all_reduce(t, group=sub, async_op=True).wait()  # SITE:async


def paused():
    yield  # SITE:frame


gen = paused()
next(gen)  # a frame that stays at one line: what a capture route hands to record_collective


def helper():
    token = recorder.record_collective("reduce_scatter_tensor", None, torch.zeros(2, dtype=torch.int64),
                                       frame=gen.gi_frame)
    recorder.record_complete(token)


th = threading.Thread(target=helper, name="helper")
th.start()
th.join()
os.kill(os.getpid(), signal.SIGKILL)
