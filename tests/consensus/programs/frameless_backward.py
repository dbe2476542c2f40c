"""C++-issued collectives on threads that run no Python, while the main thread is in
backward(): a tensor hook runs a TorchScript all-reduce forked onto torch's inter-op
pool, the way DDP's reducer issues its bucket all-reduce from autograd's device thread
on CUDA. Each call is attributed to the backward() line; the C++ capture kernel records
the repeats itself. PROG_FIX=0 (default) is consistent; PROG_EXTRA=1 makes rank 1 issue
one more all-reduce in step 3. Writes the C++ kernel's counters to $STATS_DIR/rank{R}.json."""

import json
import os

import torch
import torch.distributed as dist
from common import finish, init

STEPS, CALLS = 6, 5
rank, world = init()
pg = dist.distributed_c10d._get_default_group().boxed()


@torch.jit.script
def issue(t: torch.Tensor, pg: torch.classes.c10d.ProcessGroup, ro: torch.classes.c10d.ReduceOp):
    out = torch.ops.c10d.allreduce_([t], pg, ro, None, False, -1)
    out[1].wait()


@torch.jit.script
def forked(t: torch.Tensor, pg: torch.classes.c10d.ProcessGroup, ro: torch.classes.c10d.ReduceOp):
    torch.jit.wait(torch.jit.fork(issue, t, pg, ro))


buf, step = torch.ones(3, 2), [0]
extra = os.environ.get("PROG_EXTRA") == "1" and rank == 1


def hook(grad):
    for _ in range(CALLS + (1 if extra and step[0] == 3 else 0)):
        forked(buf, pg, torch.classes.c10d.ReduceOp())
    return grad


w = torch.ones(4, requires_grad=True)
w.register_hook(hook)
for step[0] in range(STEPS):
    (w * 2).sum().backward()  # SITE:backward
if "STATS_DIR" in os.environ:
    from hctool.agent.capture import c10d as capture_c10d

    with open(os.path.join(os.environ["STATS_DIR"], f"rank{rank}.json"), "w") as f:
        json.dump(capture_c10d.cxx_stats(), f)
finish()
