# EXPECT: verdict=consistent
# SOURCE: A1ex-Chen/DL_project_log SMDDP-Examples .../utils_reduce_tensor.py (reduce_tensor: each rank all-reduces its own loss for logging); https://github.com/KellerJordan/modded-nanogpt/issues/2
# SHAPE: every rank feeds a different loss value into all_reduce, which looks like ranks disagreeing, but only the payload differs: the call, dtype, shape and order are identical on all ranks.
# RUN: torchrun --standalone --nproc-per-node 2 a08_rank_local_loss.py
import datetime
import os
import sys

import torch
import torch.distributed as dist


def reduce_mean(t):
    rt = t.detach().clone()
    dist.all_reduce(rt)  # same call site on every rank; values differ per rank
    return rt / dist.get_world_size()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(rank)  # each rank sees different data
    w = torch.zeros(3, requires_grad=True)
    history = []
    for it in range(5):
        x, y = torch.randn(8, 3), torch.randn(8)
        loss = ((x @ w - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w.grad.copy_(reduce_mean(w.grad))
            w -= 0.1 * w.grad
            w.grad.zero_()
        history.append((loss.item(), reduce_mean(loss).item()))

    local_last, global_last = history[-1]
    check = torch.tensor([global_last])
    dist.broadcast(check, src=0)
    assert abs(check.item() - global_last) < 1e-6  # the reduced value agrees everywhere
    print(f"rank {rank}: local loss {local_last:.4f}, mean loss {global_last:.4f}: OK", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
