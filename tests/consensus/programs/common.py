"""Shared setup for the corpus programs: gloo with a short timeout so nothing
in the corpus waits long. PROG_FIX=1 selects a program's clean twin."""

import datetime
import os
import sys

import torch
import torch.distributed as dist


def init(timeout_s: float = 30.0) -> tuple[int, int]:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def finish() -> None:
    dist.destroy_process_group()
    # torch 2.13's gloo sometimes aborts in static destruction at interpreter exit
    # ("terminate called without an active exception", exit -6): 1 in 16 plain torchrun
    # runs of compiled.py without hctool. The corpus is about collectives, so it leaves
    # before that teardown (docs/consensus.md, "Known issue").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def ones(n: int = 1, dtype=torch.float32) -> torch.Tensor:
    return torch.ones(n, dtype=dtype)


def fixed() -> bool:
    return os.environ.get("PROG_FIX") == "1"
