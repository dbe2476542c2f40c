# EXPECT: verdict=consistent
# SOURCE: https://github.com/Lightning-AI/pytorch-lightning/issues/19106 (per-rank metric dicts with different keys; here gathered as objects, which is legal); https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.gather_object
# SHAPE: each rank builds a metrics dict with rank-dependent keys and nested sizes, then only rank 0 provides the output list to gather_object, so arguments differ per rank, but both object collectives are issued once by every rank with the same dst.
# RUN: torchrun --standalone --nproc-per-node 3 a23_gather_metrics_objects.py
import datetime
import os
import sys

import torch.distributed as dist


def local_metrics(rank):
    m = {"loss": 1.0 / (rank + 1), "n": 10 * (rank + 1)}
    if rank == 2:
        m["rare_class_hist"] = list(range(500))  # only this rank saw the rare class
    return m


def collect_on_main(obj, rank, world):
    out = [None] * world if rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = collect_on_main(local_metrics(rank), rank, world)
    names = [None] * world
    dist.all_gather_object(names, "worker-" + "x" * (rank * 7))  # strings of different length

    if rank == 0:
        assert [sorted(r) for r in rows][2] == ["loss", "n", "rare_class_hist"]
        assert sum(r["n"] for r in rows) == 60
    else:
        assert rows is None
    assert [len(n) for n in names] == [7, 14, 21], names
    print(f"rank {rank}: metrics gathered on rank 0, names {[len(n) for n in names]}: OK", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
