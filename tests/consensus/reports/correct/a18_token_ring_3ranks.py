# EXPECT: verdict=consistent
# SOURCE: https://docs.pytorch.org/tutorials/intermediate/dist_tuto.html (point-to-point communication); MPI token-ring idiom where rank 0 starts the token
# SHAPE: rank 0 sends before it receives while every other rank receives before it sends, from different branches, which looks like mismatched ordering around a cycle, but the cycle is broken by rank 0 going first so the token travels 0->1->2->0 without deadlock.
# RUN: torchrun --standalone --nproc-per-node 3 a18_token_ring_3ranks.py
import datetime
import os
import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    token = torch.zeros(1000)
    for lap in range(3):
        if rank == 0:
            token[0] += 1
            dist.send(token, dst=nxt)  # rank 0 injects the token
            dist.recv(token, src=prv)
        else:
            dist.recv(token, src=prv)
            token[0] += 10 * rank
            dist.send(token, dst=nxt)
    # every lap adds 1 + 10 + 20 = 31; ranks 1, 2 hold the value from the last pass
    expected = {0: 93.0, 1: 73.0, 2: 93.0}[rank]
    assert token[0].item() == expected, token[0]
    print(f"rank {rank}: token={token[0].item():.0f}: OK", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
