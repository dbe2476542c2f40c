"""The engine's process contract: how its processes are started and what they read.

A topology is one frontend (`FRONTEND_MODULE`, HTTP) plus N ranks (`RANK_MODULE`), each a
fresh interpreter. Every process reads the settings from `ARGS_ENV` (ServerArgs as JSON,
`ServerArgs.to_json`); the ranks read torchrun's RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT; rank 0 connects to the frontend at IPC_HOST:IPC_PORT with the
hex authkey IPC_AUTHKEY. A PD router is `ROUTER_MODULE` with command-line flags. The engine
owns these names; `hctool launch` (or anything else) writes them with `frontend_env` and
`rank_env`, so the engine starts without hctool.
"""

from __future__ import annotations

ARGS_ENV = "HCENGINE_ARGS"
IPC_HOST_ENV = "HCENGINE_IPC_HOST"
IPC_PORT_ENV = "HCENGINE_IPC_PORT"
IPC_AUTHKEY_ENV = "HCENGINE_IPC_AUTHKEY"
HTTP_HOST_ENV = "HCENGINE_HTTP_HOST"
HTTP_PORT_ENV = "HCENGINE_HTTP_PORT"
CHECK_INTEGRITY_ENV = "HCENGINE_CHECK_INTEGRITY"  # "1": every rank checks its accounting every tick
PAGE_TRANSFER_ENV = "HCENGINE_PAGE_TRANSFER"  # "copy": no Triton page-transfer kernel on CUDA

FRONTEND_MODULE = "engine.entrypoints.http_server"
RANK_MODULE = "engine.rank"
ROUTER_MODULE = "engine.disaggregation.mini_lb"

ENV_NAMES = (
    ARGS_ENV,
    IPC_HOST_ENV,
    IPC_PORT_ENV,
    IPC_AUTHKEY_ENV,
    HTTP_HOST_ENV,
    HTTP_PORT_ENV,
    CHECK_INTEGRITY_ENV,
    PAGE_TRANSFER_ENV,
)


def _common(args_json: str, ipc_port: int, authkey: str) -> dict[str, str]:
    return {ARGS_ENV: args_json, IPC_PORT_ENV: str(ipc_port), IPC_AUTHKEY_ENV: authkey}


def frontend_env(args_json: str, ipc_port: int, authkey: str, http_host: str, http_port: int) -> dict[str, str]:
    """The frontend's variables: it listens for rank 0 on loopback, serves HTTP on host:port."""
    return {**_common(args_json, ipc_port, authkey), HTTP_HOST_ENV: http_host, HTTP_PORT_ENV: str(http_port)}


def rank_env(
    args_json: str,
    ipc_port: int,
    authkey: str,
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    local_rank: int | None = None,
    ipc_host: str = "127.0.0.1",
) -> dict[str, str]:
    """One rank's variables (torchrun's names for the rendezvous)."""
    return {
        **_common(args_json, ipc_port, authkey),
        IPC_HOST_ENV: ipc_host,
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }
