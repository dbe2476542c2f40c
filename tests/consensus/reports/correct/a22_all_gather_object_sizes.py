# EXPECT: verdict=consistent
# SOURCE: https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.all_gather_object (pickled objects of any size; sizes are exchanged internally); composer.utils.dist.all_gather_object
# SHAPE: every rank passes a payload of a very different pickled size (rank 0 a short list, rank 1 thousands of entries), which looks like a shape mismatch in an all_gather, but all_gather_object exchanges the sizes first and pads, so differing sizes are legal.
# RUN: torchrun --standalone --nproc-per-node 2 a22_all_gather_object_sizes.py
import datetime
import os
import sys

import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()

# rank-local eval predictions: very different lengths per rank
preds = [f"sample-{rank}-{i}" for i in range(3 + 2000 * rank)]
gathered = [None] * world
dist.all_gather_object(gathered, preds)

lengths = [len(p) for p in gathered]
assert lengths == [3 + 2000 * r for r in range(world)], lengths
assert gathered[world - 1][-1] == f"sample-{world - 1}-{lengths[-1] - 1}"
print(f"rank {rank}: gathered prediction lists of lengths {lengths}: OK", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
