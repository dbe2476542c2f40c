"""One serving topology: an HTTP frontend process plus N engine ranks.

Every process is a fresh interpreter (never fork, so hctool's sitecustomize
loads in each) in its own session, with a log file in the run directory.
A waiter thread per child records when it exited, so after a cascade (rank 1
is killed, rank 0 then fails in gloo) we can name the process that died first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import requests

from engine.lab import ServerArgs, contract
from hctool.protocol import env as protocol_env
from hctool.protocol.faults import Fault
from hctool.supervise.procs import Child, ProcessSet, describe_exit, free_port, inject_env, kill_tree, python_cmd

SOURCE_ROOT = str(Path(__file__).resolve().parents[2])


class TopologyError(RuntimeError):
    """Startup failed: a process died (`death` says which) or the engine was not ready in time."""

    def __init__(self, message: str, death: Death | None = None):
        super().__init__(message)
        self.death = death


@dataclasses.dataclass
class Death:
    name: str  # "frontend" or "rank N"
    returncode: int
    log_path: Path
    when: float  # monotonic time of exit

    def message(self) -> str:
        return f"{self.name} died ({describe_exit(self.returncode)}); see {self.log_path}"


class Topology:
    """Start, watch and tear down frontend + ranks (use as a context manager)."""

    def __init__(
        self,
        server_args: ServerArgs,
        run_dir: str | Path,
        faults: Sequence[Fault] = (),
        probes: list[str] = (),
        extra_env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        rank_module: str = contract.RANK_MODULE,
        label: str = "",
        death_event: threading.Event | None = None,
        local_rank_offset: int = 0,
        inherit_probes: bool = True,
    ):
        self.inherit_probes = inherit_probes  # False: a reference engine, clean of the caller's HCTOOL_PROBES
        self.label = label  # "prefill" / "decode" in a PD topology: names deaths and logs
        self.local_rank_offset = local_rank_offset  # PD on one host: decode's GPUs follow prefill's
        self.run_dir = Path(run_dir).resolve()
        if not server_args.run_dir:
            server_args = dataclasses.replace(server_args, run_dir=str(self.run_dir))
        self.server_args = server_args
        self.faults, self.probes = list(faults), list(probes)
        self.extra_env = dict(extra_env or {})
        self.host, self.port, self._port_given = host, port, port
        self.rank_module = rank_module
        self.procs = ProcessSet()
        self.log_paths: dict[str, Path] = {}
        self.base_url: str | None = None
        self._deaths: list[Death] = []
        self._death_event = death_event or threading.Event()  # PD: one event for every part
        self._lock = threading.Lock()
        self._stopped = False

    # --- lifecycle ----------------------------------------------------------
    def start(self, timeout: float = 300.0, attempts: int = 3) -> str:
        """Start every process and return the base URL once /health is 200. Ports are
        picked free and bound a moment later, so on a shared host another job can take
        one in between: a start that failed on EADDRINUSE is retried on fresh ports."""
        for attempt in range(1, attempts + 1):
            self.spawn()
            try:
                return self.wait_healthy(timeout)
            except TopologyError:
                if attempt == attempts or not self._lost_port_race():
                    raise
            self.stop()
            self._keep_failed_logs(attempt)
            with self._lock:  # a waiter of the old processes records nothing after this
                self.procs, self._deaths, self._stopped = ProcessSet(), [], False
                self._death_event.clear()
            self.port = self._port_given
        raise AssertionError("unreachable")

    def _lost_port_race(self) -> bool:
        """Whether some process of this start failed to bind a port (its log says so)."""
        for path in self.log_paths.values():
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").lower()
                if "address already in use" in text or "eaddrinuse" in text:
                    return True
        return False

    def _keep_failed_logs(self, attempt: int) -> None:
        """The failed start's logs move aside (NAME.tryN.log); the retry writes fresh ones."""
        for path in self.log_paths.values():
            with contextlib.suppress(OSError):
                path.rename(path.with_suffix(f".try{attempt}.log"))

    def spawn(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ports = _distinct_free_ports(3 if self.port is None else 2)
        ipc_port, master_port = ports[0], ports[1]
        self.port = self.port or ports[2]
        authkey = secrets.token_hex(16)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.extra_env}
        # Children import the same engine/ and hctool/ as this process, installed or not.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (SOURCE_ROOT, env.get("PYTHONPATH")) if p)
        hctool_vars = {protocol_env.RUN_DIR: str(self.run_dir)}
        if self.faults:
            hctool_vars[protocol_env.FAULTS] = ";".join(f.spec() for f in self.faults)  # text only here
        inherited = [p for p in env.pop(protocol_env.PROBES, "").split(",") if p and self.inherit_probes]
        if self.probes or inherited:  # probes set in the environment load too (tests' own)
            hctool_vars[protocol_env.PROBES] = ",".join(dict.fromkeys([*inherited, *self.probes]))
        env = inject_env(env, **hctool_vars)
        args_json = self.server_args.to_json()
        self._spawn(
            "frontend",
            contract.FRONTEND_MODULE,
            {**env, **contract.frontend_env(args_json, ipc_port, authkey, self.host, self.port)},
        )
        world = self.server_args.world_size  # dp replicas x pp stages x tp ranks
        for rank in range(world):
            self._spawn(
                f"rank {rank}",
                self.rank_module,
                {
                    **env,
                    **contract.rank_env(
                        args_json,
                        ipc_port,
                        authkey,
                        rank,
                        world,
                        "127.0.0.1",
                        master_port,
                        rank + self.local_rank_offset,
                    ),
                    protocol_env.ROLE: self.label or "null",
                },
            )

    def wait_healthy(self, timeout: float) -> str:
        connect_host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        health = f"http://{_url_host(connect_host)}:{self.port}/health"
        deadline = time.monotonic() + timeout
        while True:
            death = self.first_death()
            if death is not None:
                raise TopologyError(death.message(), death)
            with contextlib.suppress(requests.RequestException):
                if requests.get(health, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TopologyError(f"not ready after {timeout:g} s; see the logs in {self.run_dir}")
            self._death_event.wait(0.1)
        self.base_url = f"http://{_url_host(self.host)}:{self.port}"
        return self.base_url

    def _spawn(self, name: str, module: str, env: dict[str, str]) -> Child:
        log_path = self.run_dir / (f"{self.label}-" * bool(self.label) + name.replace(" ", "") + ".log")
        self.log_paths[name] = log_path
        child = self.procs.start(name, python_cmd("-m", module), env=env, log_path=log_path)
        threading.Thread(target=self._wait_child, args=(child,), name=f"wait-{name}", daemon=True).start()
        return child

    def _wait_child(self, child: Child) -> None:
        returncode = child.popen.wait()
        with self._lock:
            if child not in self.procs.children:  # a failed start's process (see start)
                return
            self._deaths.append(
                Death(f"{self.label} {child.name}".strip(), returncode, child.log_path, time.monotonic())
            )
        self._death_event.set()

    def wait_for_death(self, timeout: float | None = None) -> Death | None:
        """Block until some process of the topology exits; the first one to die."""
        self._death_event.wait(timeout)
        return self.first_death()

    def first_death(self) -> Death | None:
        with self._lock:
            return min(self._deaths, key=lambda d: d.when, default=None)

    def shutdown(self, timeout: float = 10.0) -> dict[int, int | None]:
        """Stop gracefully: end the frontend, so rank 0 reads EOF and every rank leaves
        its loop at the same tick and exits 0; then stop() whatever is left.
        Returns each rank's exit code (None: it had to be killed)."""
        ranks = {c.name: c for c in self.procs.children if c.name.startswith("rank ")}
        for child in self.procs.children:
            if child.name == "frontend" and child.popen.poll() is None:
                child.popen.terminate()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(c.popen.poll() is None for c in ranks.values()):
            time.sleep(0.05)
        codes = {int(name.split()[1]): c.popen.poll() for name, c in ranks.items()}
        self.stop()
        return codes

    def stop(self, timeout: float = 5.0) -> None:
        """Tear everything down: SIGTERM then SIGKILL every process of every child's
        session, so even descendants of an already-dead child are found. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        sessions = [c.popen.pid for c in self.procs.children]
        for child in self.procs.children:
            if child.popen.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.popen.pid, signal.SIGTERM)  # all at once; a lone rank would hang in gloo
        for child in self.procs.children:
            kill_tree(child.popen.pid, timeout=timeout)
        leftovers = [p for p in psutil.process_iter() if _session_of(p.pid) in sessions]
        for p in leftovers:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(leftovers, timeout=timeout)
        for child in self.procs.children:
            with contextlib.suppress(Exception):
                child.popen.wait(timeout=timeout)

    # --- what the repro harness asks --------------------------------------
    def pids_by_rank(self) -> dict[int, int]:
        return {int(c.name.split()[1]): c.popen.pid for c in self.procs.children if c.name.startswith("rank ")}

    def rank_exit_codes(self) -> dict[int, int | None]:
        """Each rank's exit code now (None: still running)."""
        return {int(c.name.split()[1]): c.popen.poll() for c in self.procs.children if c.name.startswith("rank ")}

    def dead(self) -> list[tuple[str, int]]:
        with self._lock:
            return [(d.name, d.returncode) for d in sorted(self._deaths, key=lambda d: d.when)]

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _distinct_free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
