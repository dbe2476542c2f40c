# EXPECT: verdict=consistent
# NPROC: 2
# SOURCE: https://github.com/ecmwf/WeatherGenerator/pull/2726
# SHAPE: DDP training where a rank_zero_only decorator guards JSONL logging and printing; the guarded code touches only already-reduced Python floats, never a collective.
import datetime
import functools
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def rank_zero_only(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if dist.get_rank() == 0:
            return fn(*args, **kwargs)
    return wrapper


@rank_zero_only
def write_jsonl(path, record):
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")
    print(f"logged step {record['step']}: loss={record['loss']:.4f}")


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    log_path = os.path.join(tempfile.gettempdir(), f"heldout2_c01_{os.getpid()}.jsonl")
    g = torch.Generator().manual_seed(rank)
    for step in range(5):
        x = torch.randn(8, 4, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        reduced = loss.detach().reshape(1)
        dist.all_reduce(reduced)  # every rank reduces; only the logging is rank-0-only
        write_jsonl(log_path, {"step": step, "loss": reduced.item() / world})
    if rank == 0 and os.path.exists(log_path):
        os.remove(log_path)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
