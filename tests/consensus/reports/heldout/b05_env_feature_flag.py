# EXPECT: verdict=diverged culprit=1 line=30
# NPROC: 2
# SOURCE: https://github.com/vllm-project/vllm/pull/26218
# SHAPE: A decorator gates a grad-norm logger on an environment variable that is only set in rank 1's launch environment, so only rank 1 runs the all_reduce inside it.
import datetime
import functools
import os

import torch
import torch.distributed as dist

# Per-host launch environments; host of rank 1 kept an exported debug flag.
HOST_ENV = {0: {}, 1: {"TRAIN_LOG_GRAD_NORM": "1"}}


def enabled_by_env(var):
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if os.environ.get(var) == "1":
                return fn(*args, **kwargs)
            return None
        return wrapper
    return deco


@enabled_by_env("TRAIN_LOG_GRAD_NORM")
def log_grad_norm(step, grad):
    sq = grad.pow(2).sum().reshape(1)
    dist.all_reduce(sq)  # BUG: collective hidden behind a per-host env flag
    print(f"step {step}: global grad norm {sq.sqrt().item():.4f}")


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    os.environ.update(HOST_ENV[rank])
    w = torch.ones(6)
    for step in range(4):
        grad = w * (rank + 1) * 0.1
        log_grad_norm(step, grad)
        dist.all_reduce(grad)
        w -= grad / dist.get_world_size()
    print(f"[rank{rank}] w={w.tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
