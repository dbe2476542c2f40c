"""SGLang: srt/managers/scheduler.py (run_scheduler_process).

One TP rank: `python -m engine.rank`, started by `hctool launch` (or torchrun)
with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and HCENGINE_ARGS (engine/lab/contract.py).

Rank 0 also talks to the frontend over a multiprocessing connection at
HCENGINE_IPC_HOST:HCENGINE_IPC_PORT; the other ranks only see what rank 0
broadcasts each tick.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from multiprocessing.connection import Client, Connection

import torch
import torch.distributed as dist

from engine.distributed.parallel_state import (
    RendezvousError,
    init_distributed_environment,
    initialize_model_parallel,
)
from engine.lab import contract
from engine.managers.io_struct import ReadyOutput, ShutdownReq
from engine.managers.scheduler import Scheduler
from engine.server_args import ServerArgs

CONNECT_TIMEOUT_S = 120.0


def connect_frontend() -> Connection:
    host = os.environ.get(contract.IPC_HOST_ENV, "127.0.0.1")
    port = int(os.environ[contract.IPC_PORT_ENV])
    key = bytes.fromhex(os.environ[contract.IPC_AUTHKEY_ENV])
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            return Client((host, port), authkey=key)
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"frontend at {host}:{port} did not accept a connection") from None
            time.sleep(0.1)


class FrontendLink:
    """Rank 0's side of the frontend connection."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def recv(self, timeout: float) -> list:
        msgs = []
        try:
            if self.conn.poll(timeout):
                while True:
                    msgs.append(self.conn.recv())
                    if not self.conn.poll(0):
                        break
        except (EOFError, OSError):
            msgs.append(ShutdownReq())  # the frontend is gone: stop every rank
        return msgs

    def send(self, msg) -> None:
        try:
            self.conn.send(msg)
        except (BrokenPipeError, OSError):
            pass  # the shutdown message arrives on the next recv


def model_backend(args: ServerArgs, local_rank: int, world: int) -> tuple[str, torch.device]:
    """(backend of the model's group, this rank's device). On CUDA each rank takes GPU
    local_rank % count; ranks that share a GPU cannot use NCCL (it refuses two ranks on one
    device), so auto picks gloo on the CUDA tensors there: real streams, events and kernels,
    a CPU-staged all_reduce."""
    if args.device != "cuda":  # ServerArgs refuses --model-backend nccl here
        return "gloo", torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 0:
        sys.exit("Error: --device cuda but no CUDA device is visible")
    shared = int(os.environ.get("LOCAL_WORLD_SIZE", world)) > count
    backend = args.model_backend if args.model_backend != "auto" else ("gloo" if shared else "nccl")
    return backend, torch.device(f"cuda:{local_rank % count}")


def main() -> None:
    args = ServerArgs.from_json(os.environ[contract.ARGS_ENV])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if world != args.world_size:
        sys.exit(f"WORLD_SIZE {world} != --tp {args.tp_size} x --pp-size {args.pp_size} x --dp-size {args.dp_size}")
    cuda = args.device == "cuda"
    backend, device = model_backend(args, local_rank, world)
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)  # ranks share the host's cores; one BLAS thread each
    timeout = timedelta(seconds=args.dist_timeout)
    try:
        init_distributed_environment(backend, rank, world, timeout, device_id=device if backend == "nccl" else None)
    except RendezvousError as exc:
        sys.exit(f"Error: {exc}")
    # Created in the same order on every rank: the model uses the default group (with stages
    # or replicas: its stage's / replica's TP group), scheduling agreement the TP CPU group,
    # the storage prefetch thread its own; PP and DP add theirs (parallel_state.py).
    ps = initialize_model_parallel(rank, args.tp_size, args.pp_size, args.dp_size, backend, timeout)
    link = FrontendLink(connect_frontend()) if rank == 0 else None
    scheduler = Scheduler(
        args,
        ps.tp_rank,
        args.tp_size,
        ps.tp_cpu_group,
        ps.io_group,
        device,
        recv_from_frontend=link.recv if link else None,
        send_to_frontend=link.send if link else None,
        model_group=ps.model_group,
        parallel=ps if world > args.tp_size else None,
    )
    dist.barrier(group=ps.world_cpu_group)
    where = f" (pp_rank {ps.pp_rank}, dp_rank {ps.dp_rank}, tp_rank {ps.tp_rank})" if world > args.tp_size else ""
    print(f"rank {rank}/{world}{where} ready on {device}", file=sys.stderr, flush=True)
    if link is not None:
        link.send(ReadyOutput(world, args.model.vocab_size, args.max_context_len))
    try:
        scheduler.event_loop()
    finally:
        scheduler.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
