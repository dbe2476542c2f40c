# EXPECT: verdict=diverged culprit=0 line=28
# NPROC: 2
# SOURCE: https://github.com/Lightning-AI/pytorch-lightning/pull/5155
# SHAPE: Each rank checks os.path.exists on a shared cache file; rank 0 finds it missing, builds it and enters a barrier inside the build branch, rank 1 (later) finds the file and skips the barrier.
import datetime
import os
import tempfile
import time

import torch
import torch.distributed as dist


def cache_path():
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    return os.path.join(tempfile.gettempdir(), f"heldout2_b03_{run_id}.pt")


def build_features():
    time.sleep(0.05)
    return torch.arange(16, dtype=torch.float32).view(4, 4)


def load_or_build(path, rank):
    if not os.path.exists(path):
        feats = build_features()
        torch.save(feats, path)
        dist.barrier()  # BUG: barrier lives inside the rank-local "file missing" branch
        return feats
    return torch.load(path)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    if rank == 1:
        time.sleep(1.0)  # rank 1 starts later (slow import / slow node)
    feats = load_or_build(cache_path(), rank)
    for step in range(3):
        g = feats[step % 4].clone()
        dist.all_reduce(g)
    print(f"[rank{rank}] finished, g={g.tolist()}")
    dist.destroy_process_group()
    if rank == 0 and os.path.exists(cache_path()):
        os.remove(cache_path())


if __name__ == "__main__":
    main()
