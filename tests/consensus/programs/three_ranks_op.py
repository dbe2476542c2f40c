"""Three ranks: 0 and 1 make the same all_reduce, each from a line of its own (a legitimate
pairing), while rank 2 calls broadcast there: rank 2 alone is the culprit, kind op."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
dist.all_reduce(x)
if rank == 0:
    dist.all_reduce(x)  # SITE:zero
elif rank == 1:
    dist.all_reduce(x)  # SITE:one
else:
    dist.broadcast(x, src=0)  # SITE:bcast
dist.destroy_process_group()
