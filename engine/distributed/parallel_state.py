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
