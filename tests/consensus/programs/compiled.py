"""Collectives inside a torch.compile'd function (backend aot_eager, or
$PROG_BACKEND, e.g. inductor; fullgraph):
dynamo turns dist.all_reduce into a functional collective, so at run time the
graph issues `_c10d_functional` ops from C++. Rank 1 runs the compiled step once
more than rank 0 (its extra call blocks). Clean twin: PROG_FIX=1."""

import os
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
from common import finish, fixed, init  # noqa: E402

rank, world = init()


@torch.compile(backend=os.environ.get("PROG_BACKEND", "aot_eager"), fullgraph=True)
def step(x):
    y = x * 2
    dist.all_reduce(y)
    return funcol.all_reduce(y + 1, "sum", dist.group.WORLD)


steps = 2 + (1 if rank == 1 and not fixed() else 0)
for i in range(steps):
    out = step(torch.full((4,), float(i)))  # SITE:step
print(f"rank {rank} out {out.tolist()}", flush=True)
finish()
