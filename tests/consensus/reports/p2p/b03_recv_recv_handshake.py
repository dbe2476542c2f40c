# EXPECT: verdict=hung culprit=0,1 line=17
# KIND: wait_cycle
# SOURCE: https://github.com/pytorch/gloo/issues/308 (send/recv ordering hangs with the gloo backend); https://github.com/pytorch/pytorch/pull/11275 (every send must be matched with a recv on the other side)
# SHAPE: both ranks wait for the peer's "ready" header with a blocking dist.recv before sending their own header, so each recv waits for a send the peer will only issue after its own recv: a recv/recv wait cycle.
# RUN: torchrun --standalone --nproc-per-node 2 b03_recv_recv_handshake.py
import datetime
import os
import sys

import torch
import torch.distributed as dist


def handshake(rank, peer):
    mine = torch.tensor([rank, 1234], dtype=torch.int64)
    theirs = torch.empty(2, dtype=torch.int64)
    dist.recv(theirs, src=peer)  # <-- BUG: both ranks wait for the peer's header first
    dist.send(mine, dst=peer)
    return theirs


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    theirs = handshake(rank, 1 - rank)
    print(f"rank {rank}: peer header {theirs.tolist()}", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
