# EXPECT: verdict=consistent
# SOURCE: pytorch/pytorch torch/distributed/distributed_c10d.py broadcast_object_list (broadcasts the object sizes first, then the payload; src serializes, receivers allocate from the received sizes)
# SHAPE: the sender broadcasts a length and a payload from a `send_blob` helper while receivers allocate a buffer of the received length in `recv_blob`, so the shapes are only known on the receiver after the first broadcast, but the two broadcasts are paired in the same order on every rank.
# RUN: torchrun --standalone --nproc-per-node 2 a12_broadcast_size_then_payload.py
import datetime
import os
import sys

import torch
import torch.distributed as dist


def send_blob(data: bytes, src: int):
    n = torch.tensor([len(data)], dtype=torch.int64)
    dist.broadcast(n, src=src)
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    dist.broadcast(payload, src=src)


def recv_blob(src: int) -> bytes:
    n = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(n, src=src)
    payload = torch.empty(int(n.item()), dtype=torch.uint8)  # size learned from the sender
    dist.broadcast(payload, src=src)
    return bytes(payload.tolist())


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
msg = b"tokenizer-merges:" + b"ab " * 40
for src in (0, 1):  # each rank takes a turn as the source
    if rank == src:
        send_blob(msg + bytes([src]), src)
        got = msg + bytes([src])
    else:
        got = recv_blob(src)
    assert got == msg + bytes([src]), got[:20]
print(f"rank {rank}: exchanged {len(msg) + 1}-byte blobs both ways: OK", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
