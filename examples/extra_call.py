"""The commonest rank-divergence bug, in 20 lines: rank 1 logs a metric with one extra
all_reduce at step 7. gloo pairs it silently with rank 0's next loop call, the sums are
wrong from then on, and the job only hangs at the end, in the barrier. Try:

    hctool check-consensus run --nproc 2 -- examples/extra_call.py
"""

import torch
import torch.distributed as dist


def log_metric(value: float) -> None:
    dist.all_reduce(torch.tensor([value]))  # the extra call: only where the rank-local condition holds


dist.init_process_group("gloo")
rank = dist.get_rank()
grad = torch.ones(1)
for step in range(20):
    dist.all_reduce(grad)
    if rank == 1 and step == 7:  # a rank-local condition (a loss spike, a timer, a flag)
        log_metric(float(step))
dist.barrier()
dist.destroy_process_group()
