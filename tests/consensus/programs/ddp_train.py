"""DDP training on gloo: every gradient bucket all-reduce comes from DDP's C++
reducer. Rank 1 gets one batch more than rank 0 (uneven inputs, the classic DDP
hang): its extra backward() all-reduces alone, while rank 0 lingers after
destroy_process_group. Clean twin: PROG_FIX=1.
Prints how many bucket all-reduces DDP made (its buckets in effect at each
backward: one before the first rebuild, then the rebuilt ones) so a test can
check every one was recorded."""

import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

rank, world = init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 4))
# ~17 KiB of gradients in 8 KiB buckets: several bucket all-reduces per step
ddp = DDP(model, bucket_cap_mb=8 / 1024)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
bucket_reduces = user_reduces = 0
batches = 6 + (1 if rank == 1 and not fixed() else 0)
for step in range(batches):
    x = torch.randn(8, 64)
    loss = ddp(x).square().mean()
    opt.zero_grad()
    bucket_reduces += len(ddp.reducer._get_zeros_like_grad_buckets())  # each is all-reduced once
    loss.backward()  # SITE:backward
    opt.step()
    if step % 3 == 2:
        dist.all_reduce(loss.detach().clone())  # SITE:log
        user_reduces += 1
print(f"ddp_bucket_allreduces={bucket_reduces} user_allreduces={user_reduces}", flush=True)
finish()
if not fixed() and rank == 0:
    time.sleep(30)  # lingers after destroy_process_group, as NCCL's teardown can: not a missing rank
