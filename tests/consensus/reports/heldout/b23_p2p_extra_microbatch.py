# EXPECT: verdict=diverged culprit=0 line=18
# NPROC: 2
# SOURCE: https://github.com/pytorch/pytorch/issues/172668
# SHAPE: In a 2-stage pipeline the first stage derives its micro-batch count from its own data length (5) while the last stage uses the configured count (4), so stage 0 sends one activation nobody receives.
import datetime

import torch
import torch.distributed as dist

NUM_MICROBATCHES = 4
MB_SIZE = 2


def first_stage(batch):
    n_mb = (len(batch) + MB_SIZE - 1) // MB_SIZE  # BUG: 9 rows -> 5 micro-batches, not the configured 4
    for mb in range(n_mb):
        act = batch[mb * MB_SIZE:(mb + 1) * MB_SIZE].sum(0) * 2.0
        dist.send(act, dst=1)
    return n_mb


def last_stage():
    outs = []
    for mb in range(NUM_MICROBATCHES):
        act = torch.empty(3)
        dist.recv(act, src=0)
        outs.append(act.sum().item())
    return outs


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    if rank == 0:
        n = first_stage(torch.arange(27, dtype=torch.float32).view(9, 3))
        print(f"stage0 sent {n} micro-batches")
    else:
        print(f"stage1 outputs: {last_stage()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
