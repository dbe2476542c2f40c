"""Shared setup for the corpus programs: gloo with a short timeout so nothing
in the corpus waits long. PROG_FIX=1 selects a program's clean twin."""

import datetime
import os

import torch
import torch.distributed as dist


def init(timeout_s: float = 30.0) -> tuple[int, int]:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def finish() -> None:
    dist.destroy_process_group()


def ones(n: int = 1, dtype=torch.float32) -> torch.Tensor:
    return torch.ones(n, dtype=dtype)


def fixed() -> bool:
    return os.environ.get("PROG_FIX") == "1"
