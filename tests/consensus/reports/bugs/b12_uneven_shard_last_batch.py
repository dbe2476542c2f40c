# EXPECT: verdict=diverged culprit=0 line=32
# KIND: extra
# SOURCE: https://github.com/mlcommons/storage/issues/455
# SHAPE: a hand-rolled strided shard of a 9-sample dataset gives rank 0 five samples and rank 1 four; with batch size 2 rank 0 runs a third step whose all_reduce meets rank 1's end-of-epoch barrier.
import datetime

import torch
import torch.distributed as dist

DATASET = [float(i) for i in range(9)]  # 9 samples, not divisible by 2 ranks
BATCH = 2


def shard(dataset, rank, world):
    return dataset[rank::world]  # no padding, no drop_last


def batches(samples, size):
    for i in range(0, len(samples), size):
        yield samples[i:i + size]


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    local = shard(DATASET, rank, world)
    print(f"[rank{rank}] {len(local)} samples", flush=True)
    for step, batch in enumerate(batches(local, BATCH)):
        grad = torch.tensor([sum(batch)])
        # BUG: the number of iterations depends on the local shard length,
        # so rank 0 issues one more all_reduce than rank 1.
        dist.all_reduce(grad)
        print(f"[rank{rank}] step {step}: reduced grad {grad.item()}", flush=True)
    dist.barrier()  # end of epoch
    print(f"[rank{rank}] epoch done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
