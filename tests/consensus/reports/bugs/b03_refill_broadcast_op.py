# EXPECT: verdict=diverged culprit=1 line=22
# KIND: op
# SOURCE: https://github.com/sgl-project/sglang/issues/30760
# SHAPE: when its rank-local sample buffer runs dry, rank 1 calls refill(), which broadcasts a fresh shuffle seed from rank 0; rank 0 never refills at that step and is in the per-step all_reduce, so a broadcast meets an all_reduce and both ranks hang.
import datetime

import torch
import torch.distributed as dist


def make_buffer(rank, seed):
    # rank 1 holds a smaller local shard, so its buffer empties sooner
    size = 8 if rank == 0 else 3
    g = torch.Generator().manual_seed(seed + rank)
    return list(torch.randperm(size, generator=g).tolist())


def refill(rank):
    seed = torch.tensor([1234 if rank == 0 else 0], dtype=torch.int64)
    # BUG: refill() is only reached by the rank whose own buffer is empty,
    # but broadcast is a collective that every rank must enter.
    dist.broadcast(seed, src=0)
    return make_buffer(rank, int(seed.item()))


def train(rank, steps=6):
    buffer = make_buffer(rank, 0)
    for step in range(steps):
        if not buffer:
            buffer = refill(rank)
        sample = buffer.pop()
        t = torch.tensor([float(sample)])
        dist.all_reduce(t)
        print(f"[rank{rank}] step {step}: sum of samples = {t.item()}", flush=True)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    train(rank)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
