"""SGLang: srt/distributed/parallel_state.py (init_distributed_environment).

Rendezvous that listens only where the ranks connect.

torch's env:// rendezvous starts its TCPStore on every interface (IPv4 and IPv6),
even with MASTER_ADDR=127.0.0.1. Rank 0 here binds the store's socket to
MASTER_ADDR itself and hands it to TCPStore; with a loopback MASTER_ADDR (a
single-host launch) gloo and NCCL are told to use the loopback interface too,
so nothing of the job is reachable from outside the host.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist


class RendezvousError(RuntimeError):
    """MASTER_ADDR/MASTER_PORT cannot be used; the message is one line."""


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _listen(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise RendezvousError(f"MASTER_ADDR {host!r} does not resolve: {exc}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise RendezvousError(f"cannot listen on MASTER_ADDR:MASTER_PORT {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    return sock


def init_distributed_environment(backend: str, rank: int, world_size: int, timeout: timedelta, **kwargs) -> None:
    """dist.init_process_group over a TCPStore bound to MASTER_ADDR only."""
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    if is_loopback(host):
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(var, "lo")
    if rank == 0:
        fd = _listen(host, port).detach()
        store = dist.TCPStore(host, port, world_size, True, timeout, master_listen_fd=fd)
    else:
        store = dist.TCPStore(host, port, world_size, False, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **kwargs)


@dataclass
class ParallelState:
    """One rank's place in the job and its groups (SGLang: the GroupCoordinators of
    parallel_state.py). Ranks are laid out dp-major, then pp, then tp:
    rank = (dp_rank * pp_size + pp_rank) * tp_size + tp_rank, so a stage's or a replica's TP
    ranks are consecutive, as SGLang's are. Every group is created on every rank in one
    order (new_group is itself a collective over the default group)."""

    rank: int
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    dp_rank: int
    dp_size: int
    model_group: object  # this stage's / replica's TP ranks: the model's all_reduce (None: default)
    tp_cpu_group: object  # gloo, the same ranks: the scheduler's and the cache's agreement
    io_group: object  # gloo, the same ranks: the storage prefetch thread's votes
    world_cpu_group: object  # gloo, every rank: the request broadcast, PP agreement across stages
    world_io_group: object  # gloo, every rank: the prefetch thread's votes across stages (PP)
    pp_group: object  # gloo, this tp_rank's rank in every stage: activations (p2p), next token ids
    dp_cpu_group: object  # gloo, this tp_rank's rank in every replica: coordinate_batch_across_dp
    mlp_group: object  # every rank (DP): the MLP shared by the replicas (None: default group)

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def stage_rank(self, pp_rank: int) -> int:
        """The global rank of this rank's peer (same tp_rank) in stage pp_rank."""
        return (self.dp_rank * self.pp_size + pp_rank) * self.tp_size + self.tp_rank


def initialize_model_parallel(
    rank: int, tp_size: int, pp_size: int, dp_size: int, backend: str, timeout: timedelta
) -> ParallelState:
    """SGLang's initialize_model_parallel: the groups of one rank (after init_process_group).
    With pp = dp = 1 this is the TP engine of before: the model on the default group and
    two gloo groups of every rank, so a TP run's trace has the groups it always had."""
    world = tp_size * pp_size * dp_size
    tp_rank, rest = rank % tp_size, rank // tp_size
    pp_rank, dp_rank = rest % pp_size, rest // pp_size

    def blocks(backend_: str | None) -> object:
        """One group per consecutive block of tp_size ranks; returns this rank's."""
        mine = None
        for start in range(0, world, tp_size):
            ranks = list(range(start, start + tp_size))
            g = dist.new_group(ranks, backend=backend_, timeout=timeout)
            if rank in ranks:
                mine = g
        return mine

    def strided(stride: int, span: int) -> object:
        """One gloo group per set of `span` ranks `stride` apart (a tp_rank's rank in every
        stage: stride tp; in every replica: stride pp * tp); returns this rank's."""
        mine = None
        for first in range(world):
            if (first // stride) % span:
                continue  # not the first of its set
            ranks = [first + k * stride for k in range(span)]
            g = dist.new_group(ranks, backend="gloo", timeout=timeout)
            if rank in ranks:
                mine = g
        return mine

    if pp_size == 1 and dp_size == 1:
        cpu = dist.new_group(backend="gloo", timeout=timeout)
        io = dist.new_group(backend="gloo", timeout=timeout)
        return ParallelState(rank, tp_rank, tp_size, 0, 1, 0, 1, None, cpu, io, cpu, io, None, None, None)
    model = blocks(backend)
    cpu = blocks("gloo")
    io = blocks("gloo")
    world_cpu = dist.new_group(backend="gloo", timeout=timeout)
    world_io = dist.new_group(backend="gloo", timeout=timeout)
    pp_group = strided(tp_size, pp_size) if pp_size > 1 else None
    dp_group = strided(tp_size * pp_size, dp_size) if dp_size > 1 else None
    return ParallelState(
        rank,
        tp_rank,
        tp_size,
        pp_rank,
        pp_size,
        dp_rank,
        dp_size,
        model,
        cpu,
        io,
        world_cpu,
        world_io,
        pp_group,
        dp_group,
        None,
    )
