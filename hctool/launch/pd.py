"""A PD serving topology: a prefill server (frontend + P ranks), a decode server
(frontend + D ranks) and the router (engine.disaggregation.mini_lb) in front.

Each side is a `Topology` of its own (its own torch.distributed world), labelled
so a death names its side ("decode rank 1 died ..."); one death event serves
all three parts, so whichever dies first wakes the watcher.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import requests

from engine.lab import ServerArgs, contract
from hctool.launch.topology import SOURCE_ROOT, Death, Topology, TopologyError, _distinct_free_ports, _url_host
from hctool.protocol.faults import Fault
from hctool.supervise.procs import inject_env, python_cmd


class PDTopology:
    def __init__(
        self,
        server_args: ServerArgs,
        prefill_tp: int,
        decode_tp: int,
        run_dir: str | Path,
        faults: Sequence[Fault] = (),
        probes: list[str] = (),
        host: str = "127.0.0.1",
        port: int | None = None,
        extra_env: dict[str, str] | None = None,
        side_env: dict[str, dict[str, str]] | None = None,
    ):
        self.run_dir = Path(run_dir).resolve()
        self.host, self.port = host, port
        self.extra_env = dict(extra_env or {})
        self.death_event = threading.Event()
        boot_port = _distinct_free_ports(1)[0]
        base = dataclasses.replace(server_args, run_dir=server_args.run_dir or str(self.run_dir))
        self.bootstrap = ("127.0.0.1", boot_port)
        prefill_args = dataclasses.replace(
            base, tp_size=prefill_tp, disaggregation_mode="prefill", disaggregation_bootstrap_port=boot_port
        )
        decode_args = dataclasses.replace(base, tp_size=decode_tp, disaggregation_mode="decode")
        side_env = side_env or {}
        # On one CUDA host the prefill takes GPUs [0, P) and the decode [P, P + D).
        offsets = {"prefill": 0, "decode": prefill_tp if base.device == "cuda" else 0}
        self.sides = [
            Topology(
                a,
                self.run_dir,
                faults=faults,
                probes=probes,
                label=label,
                extra_env={**self.extra_env, **side_env.get(label, {})},
                death_event=self.death_event,
                local_rank_offset=offsets[label],
            )
            for label, a in (("prefill", prefill_args), ("decode", decode_args))
        ]
        self.prefill, self.decode = self.sides
        self.log_paths: dict[str, Path] = {}
        self.base_url: str | None = None

    def start(self, timeout: float = 300.0) -> str:
        deadline = time.monotonic() + timeout
        for side in self.sides:
            side.spawn()
            self.log_paths.update({f"{side.label} {n}": p for n, p in side.log_paths.items()})
        self.port = self.port or _distinct_free_ports(1)[0]
        side_url = {s.label: f"http://127.0.0.1:{s.port}" for s in self.sides}
        # The router's process joins the prefill side's set: watched and reaped with it.
        self.prefill.log_paths["router"] = self.log_paths["router"] = self.run_dir / "router.log"
        spawn_router(
            self.prefill,
            self.host,
            self.port,
            side_url["prefill"],
            f"{self.bootstrap[0]}:{self.bootstrap[1]}",
            side_url["decode"],
            self.extra_env,
        )
        self.base_url = wait_router_healthy(self, self.host, self.port, deadline, timeout)
        return self.base_url

    def first_death(self) -> Death | None:
        deaths = [d for d in (s.first_death() for s in self.sides) if d is not None]
        return min(deaths, key=lambda d: d.when, default=None)

    def wait_for_death(self, timeout: float | None = None) -> Death | None:
        self.death_event.wait(timeout)
        return self.first_death()

    def dead(self) -> list[tuple[str, int]]:
        with self.prefill._lock, self.decode._lock:
            deaths = sorted(self.prefill._deaths + self.decode._deaths, key=lambda d: d.when)
        return [(d.name, d.returncode) for d in deaths]

    # --- what the repro harness asks: the decode side is the one watched ------
    def pids_by_rank(self) -> dict[int, int]:
        return self.decode.pids_by_rank()

    def rank_exit_codes(self) -> dict[int, int | None]:
        return self.decode.rank_exit_codes()

    @property
    def procs(self):
        return _AllProcs(self.sides)

    def shutdown(self, timeout: float = 10.0) -> dict[int, int | None]:
        """Graceful: the router goes, then each side as `Topology.shutdown`; the decode's exit codes."""
        for child in self.prefill.procs.children:
            if child.name == "router" and child.popen.poll() is None:
                child.popen.terminate()
        codes = self.decode.shutdown(timeout)
        self.prefill.shutdown(timeout)
        return codes

    def stop(self, timeout: float = 5.0) -> None:
        """Every part at once (a lone rank would sit in gloo), each side's sessions reaped."""
        for side in self.sides:
            for child in side.procs.children:
                if child.popen.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        child.popen.terminate()
        for side in self.sides:
            side.stop(timeout)

    def __enter__(self) -> PDTopology:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def spawn_router(
    owner: Topology, host: str, port: int, prefill_url: str, bootstrap: str, decode_url: str, extra_env: dict[str, str]
) -> None:
    """Start mini_lb as a process of `owner` (its death is recorded there as "router")."""
    env = inject_env(
        {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            **extra_env,
            "PYTHONPATH": os.pathsep.join(p for p in (SOURCE_ROOT, os.environ.get("PYTHONPATH")) if p),
        },
        HCTOOL_RUN_DIR=str(owner.run_dir),
    )
    cmd = python_cmd(
        "-m",
        contract.ROUTER_MODULE,
        "--host",
        host,
        "--port",
        str(port),
        "--prefill",
        prefill_url,
        bootstrap,
        "--decode",
        decode_url,
    )
    owner.run_dir.mkdir(parents=True, exist_ok=True)
    owner.log_paths["router"] = owner.run_dir / "router.log"
    child = owner.procs.start("router", cmd, env=env, log_path=owner.run_dir / "router.log")

    def wait() -> None:
        code = child.popen.wait()
        with owner._lock:
            owner._deaths.append(Death("router", code, child.log_path, time.monotonic()))
        owner._death_event.set()

    threading.Thread(target=wait, name="wait-router", daemon=True).start()


def wait_router_healthy(topo, host: str, port: int, deadline: float, timeout: float) -> str:
    """Until the router's /health is 200 (it asks both sides), or a death, or the deadline."""
    connect = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    health = f"http://{_url_host(connect)}:{port}/health"
    while True:
        death = topo.first_death()
        if death is not None:
            raise TopologyError(death.message(), death)
        with contextlib.suppress(requests.RequestException):
            if requests.get(health, timeout=5).status_code == 200:
                return f"http://{_url_host(host)}:{port}"
        if time.monotonic() > deadline:
            raise TopologyError(f"not ready after {timeout:g} s; see the logs in {topo.run_dir}")
        time.sleep(0.2)


class RouterTopology(Topology):
    """`hctool launch --pd-role router`: the router alone, in front of servers started elsewhere."""

    def __init__(self, prefill_url: str, bootstrap: str, decode_url: str, run_dir, host: str, port: int | None):
        super().__init__(ServerArgs(), run_dir, host=host, port=port, label="")
        self.urls = (prefill_url, bootstrap, decode_url)

    def start(self, timeout: float = 300.0) -> str:
        self.port = self.port or _distinct_free_ports(1)[0]
        spawn_router(self, self.host, self.port, *self.urls, self.extra_env)
        self.base_url = wait_router_healthy(self, self.host, self.port, time.monotonic() + timeout, timeout)
        return self.base_url


class _AllProcs:
    def __init__(self, sides):
        self.children = [c for s in sides for c in s.procs.children]
