"""A world of one (the recorder injected) that counts entries into the c10d
dispatcher capture kernel: calls made through torch.distributed are recorded by
their wrapper and must not enter it (it costs tens of µs a call); a
ProcessGroup method called directly (as C++ code such as DDP's reducer does)
must, and is recorded there. Prints one JSON line."""

import json
import tempfile

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
from hctool.agent.capture import state  # noqa: E402 - installed by init_process_group

entries = [0]
nested = state.nested


def counting_nested():  # the kernels' first call
    entries[0] += 1
    return nested()


state.nested = counting_nested
t, out = torch.ones(2, requires_grad=True), torch.zeros(2)
for _ in range(5):
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.all_gather_into_tensor(out, t.detach())
python_issued = entries[0]
pg = dist.distributed_c10d._get_default_group()
pg.allreduce([torch.ones(2)]).wait()
print(json.dumps({"python_issued": python_issued, "direct": entries[0] - python_issued}), flush=True)
dist.destroy_process_group()
