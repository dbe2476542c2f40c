"""A training loop that stops on a wall-clock budget, read from each rank's own clock: a
collective per step, then `if time.monotonic() - start > BUDGET: break`. Every rank starts its
clock after one barrier and a step takes 0.2 s, so the budget (0.9 s) falls mid-step and every
rank stops after the same step, until one rank's clock runs fast (clock-skew, clock-jump): it
stops a step early and its peers wait in an all_reduce it never enters."""

import time

import torch
import torch.distributed as dist

from common import done, init

BUDGET_S, STEP_S = 0.9, 0.2

init()
start, steps = time.monotonic(), 0
while True:
    time.sleep(STEP_S)                      # the step's compute
    dist.all_reduce(torch.ones(4))          # its gradient sync
    steps += 1
    if time.monotonic() - start > BUDGET_S:  # rank-local: this rank's clock
        break
done(steps)
