# EXPECT: verdict=consistent
# SOURCE: huggingface accelerate Accelerator.main_process_first (https://huggingface.co/docs/accelerate/concept_guides/deferring_execution); same helper as axolotl utils/distributed.py zero_first
# SHAPE: the barrier sits on two different lines taken by disjoint ranks (non-main ranks before the body, main rank after it), which looks like each rank calling a different barrier, but every rank calls barrier exactly once so the sequences match.
# RUN: torchrun --standalone --nproc-per-node 2 a03_main_process_first_ctx.py
import datetime
import json
import os
import sys
import tempfile
from contextlib import contextmanager

import torch.distributed as dist


@contextmanager
def main_process_first(is_main):
    if not is_main:
        dist.barrier()  # replicas wait here until the main process has built the cache
    yield
    if is_main:
        dist.barrier()  # main process releases the replicas


def build_or_load_cache(path, rank):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f), "loaded"
    vocab = {w: i for i, w in enumerate(["<pad>", "the", "cat", "sat"])}
    with open(path, "w") as f:
        json.dump(vocab, f)
    return vocab, "built"


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    path = os.path.join(tempfile.gettempdir(), f"c31_vocab_{os.environ['MASTER_PORT']}.json")
    with main_process_first(rank == 0):
        vocab, how = build_or_load_cache(path, rank)
    assert how == ("built" if rank == 0 else "loaded"), how
    print(f"rank {rank}: vocab {how}, size {len(vocab)}: OK", flush=True)
    dist.barrier()
    if rank == 0:
        os.remove(path)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
