# EXPECT: verdict=consistent
# SOURCE: https://github.com/NVIDIA/nccl/issues/479 (group the send and recv so they form one sendrecv); torch.distributed.batch_isend_irecv docs example (send to next, recv from prev in one batch)
# SHAPE: a V-shaped pipeline (rank 0 embeds, rank 1 transforms, rank 0 runs the head) where at every tick rank 0 sends micro-batch i and receives the output of i-1 while rank 1 does the mirror image, so both ranks send to each other at the same time, which is legal because the sends and recvs are posted together in one non-blocking batch.
# RUN: torchrun --standalone --nproc-per-node 2 a16_vshape_pipeline_batch_p2p.py
import datetime
import os
import sys

import torch
import torch.distributed as dist

M, N = 5, 256 * 1024  # 5 micro-batches of 1 MiB each


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    peer = 1 - rank
    results, pending = [], None  # pending: rank 1's transformed micro-batch not yet returned

    for tick in range(M + 1):
        ops, inbox = [], torch.empty(N)
        if rank == 0:
            if tick < M:
                ops.append(dist.P2POp(dist.isend, torch.full((N,), float(tick)), peer))
            if tick > 0:
                ops.append(dist.P2POp(dist.irecv, inbox, peer))
        else:
            if tick > 0:
                ops.append(dist.P2POp(dist.isend, pending, peer))
            if tick < M:
                ops.append(dist.P2POp(dist.irecv, inbox, peer))
        for w in dist.batch_isend_irecv(ops):  # both ranks send and receive in one batch
            w.wait()
        if rank == 0 and tick > 0:
            results.append(inbox[0].item() * 3)  # head
        if rank == 1 and tick < M:
            pending = inbox + 1  # middle stage

    if rank == 0:
        assert results == [(i + 1) * 3.0 for i in range(M)], results
        print(f"rank 0: head outputs {results}: OK", flush=True)
    else:
        print("rank 1: transformed and returned all micro-batches: OK", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
