"""Rank 1 retries its admission vote once (a rank-local retry): `vote` is reached from
`admit` on every rank and, once, from `retry` on rank 1. With `--probe __main__:vote` the
report names, per rank, the function the divergent vote was entered from."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def vote(x):
    dist.all_reduce(x)  # SITE:vote


def admit(i):
    vote(torch.ones(1))


def retry(i):
    vote(torch.ones(1))


def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    for i in range(4):
        admit(i)
        if dist.get_rank() == 1 and i == 2:
            retry(i)
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
