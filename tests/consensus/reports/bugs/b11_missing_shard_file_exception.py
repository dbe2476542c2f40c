# EXPECT: verdict=diverged culprit=1 line=46
# KIND: missing
# SOURCE: https://github.com/tier4/Diffusion-Planner/pull/336
# SHAPE: each rank opens its own per-step shard file inside try/except; rank 1's shard for step 2 was never written, the FileNotFoundError is swallowed with `continue`, and rank 1 skips that step's all_reduce so the ranks drift apart and hang at the final barrier.
import datetime
import json
import os
import shutil
import tempfile

import torch
import torch.distributed as dist

STEPS = 5


def prepare_shards(root, rank):
    for step in range(STEPS):
        sample_id = step * 2 + rank
        if sample_id == 5:  # this sample failed validation upstream and was dropped
            continue
        with open(os.path.join(root, f"rank{rank}_step{step}.json"), "w") as f:
            json.dump({"values": [sample_id, sample_id + 1]}, f)


def load_shard(root, rank, step):
    with open(os.path.join(root, f"rank{rank}_step{step}.json")) as f:
        return json.load(f)["values"]


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    root = tempfile.mkdtemp(prefix=f"b11_rank{rank}_")
    prepare_shards(root, rank)
    try:
        for step in range(STEPS):
            try:
                values = load_shard(root, rank, step)
            except FileNotFoundError as e:
                # BUG: the IO error is rank-local; swallowing it with `continue`
                # makes rank 1 skip the all_reduce that rank 0 still issues.
                print(f"[rank{rank}] step {step}: {e.__class__.__name__}, skipping", flush=True)
                continue
            total = torch.tensor([float(sum(values))])
            dist.all_reduce(total)
            print(f"[rank{rank}] step {step}: global sum {total.item()}", flush=True)
        dist.barrier()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
