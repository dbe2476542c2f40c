"""Shared by the timing-bug programs: start a gloo world from torchrun's variables (or a world
of the ranks hctool starts for a SCRIPT.py), with a deadline on every wait."""

import os
import sys
from datetime import timedelta

import torch.distributed as dist


def init() -> int:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    dist.barrier()  # every rank starts its clock after this point
    return dist.get_rank()


def done(steps: int) -> None:
    # one write per line: under PYTHONUNBUFFERED print() writes the text and its newline apart,
    # and ranks sharing torchrun's stdout cut into each other's lines
    sys.stdout.write(f"rank {dist.get_rank()} steps {steps}\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    os._exit(0)  # no interpreter teardown with gloo threads alive
