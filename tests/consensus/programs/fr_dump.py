"""Run under torchrun with TORCH_FR_BUFFER_SIZE set: each rank inserts one
all_reduce of the same byte size from a different line (rank 0 at step 2, of int32s;
rank 1 at step 4, of float32s), so the counts match, gloo pairs the calls and nothing
hangs, then every rank writes its Flight Recorder dump to $TORCH_FR_DUMP_TEMP_FILE<rank>.
The dtypes the dumps record differ where rank 0's extra call paired with rank 1's loop."""

import os
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from common import finish, init, ones  # noqa: E402

rank, world = init()
t = ones(4)
for step in range(6):
    dist.all_reduce(t)  # SITE:loop
    if rank == 0 and step == 2:
        dist.all_reduce(torch.ones(4, dtype=torch.int32))  # SITE:extra0
    if rank == 1 and step == 4:
        dist.all_reduce(t)  # SITE:extra1
dump = torch._C._distributed_c10d._dump_fr_trace()
with open(f"{os.environ['TORCH_FR_DUMP_TEMP_FILE']}{rank}", "wb") as f:
    f.write(dump)
finish()
