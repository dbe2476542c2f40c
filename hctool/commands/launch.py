"""`hctool launch`: start a frontend and N engine ranks, print `ready: URL`, watch them.

Exit codes: 1 when a process of the topology died; 2 on usage errors, a busy --port and a
startup that did not finish within --startup-timeout (each with a hint); after Ctrl-C,
SIGTERM or SIGHUP it ends by that signal (hctool/supervise/signals.py: a shell reads 130, 143, 129).
Every process of the topology is gone when it returns.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
from pathlib import Path

import typer
from rich.console import Console

from hctool.console.errors import UsageError
from hctool.console.runs import make_run_folder, run_folder_name

err = Console(stderr=True, highlight=False, soft_wrap=True)

HELP = """Start an HTTP frontend and --tp engine ranks; print `ready: http://HOST:PORT` on stdout.

Options not listed below are engine flags (see the list at the end), e.g.
`hctool launch --tp 2 --enable-hierarchical-cache --max-total-tokens 4096`.
"""


DEFAULT_PORT = 30000  # SGLang's: clients and scripts written for it find the server here

# Engine flags that launch sets itself (from --cuda/--cpu and --run-dir).
LAUNCH_OWNED = ("--device", "--run-dir")


def _engine_flags_help() -> str:
    from engine.lab import ServerArgs

    text = ServerArgs.cli_help()
    lines, skipping = [], False
    for line in text[text.index("options:") :].splitlines()[1:]:
        if line.startswith("  --"):  # a new flag; --device and --run-dir are launch's own options
            skipping = line.split()[0] in LAUNCH_OWNED
        if not skipping:
            lines.append(line)
    # Keep argparse's layout: rich would reflow it, so mark it as a literal block.
    return "\b\nEngine flags:\n" + "\n".join(lines)


def _detect_device(cuda: bool | None, tp: int) -> str:
    if cuda is False:
        return "cpu"
    if cuda is None and not os.path.exists("/dev/nvidiactl"):
        return "cpu"  # no driver: skip importing torch just to learn that
    import torch

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cuda is None:
        return "cuda" if available >= tp else "cpu"
    if available < tp:
        raise UsageError(f"--cuda needs {tp} CUDA devices, found {available}", "drop --cuda or lower --tp")
    return "cuda"


def _validate_faults(specs: list[str]):
    """--inject as Faults; the workload's kinds are refused: launch sends no requests of its own."""
    from hctool.protocol.faults import KIND, Acts, parse_fault

    faults = []
    for spec in specs:
        try:
            f = parse_fault(spec)
        except ValueError as exc:
            raise UsageError(f"bad --inject {spec!r}: {exc}", "e.g. --inject h2d-sleep:rank=1,ms=30") from None
        if KIND[f.kind].acts is Acts.WORKLOAD:
            raise UsageError(
                f"--inject {f.kind} acts on a workload, and launch runs none",
                "use it in `hctool chaos run` or a repro scenario",
            )
        faults.append(f)
    return faults


class _FaultNotes:
    """What the fault controller does, as it does it, on stderr (launch keeps no history file)."""

    def add(self, what: str, **kw) -> None:
        if what == "fault-acted":
            err.print(f"fault {kw['fault']}: acted on rank {kw['rank']} at {kw['at_s']:g} s", markup=False)
        elif what == "rank-continue":
            err.print(f"fault: pid {kw['pid']} continued at {kw['at_s']:g} s", markup=False)


def _fault_summary(faults, fc, run_dir: Path) -> None:
    """How often each fault fired, as check-consensus says it: the ranks' counts, the controller's."""
    from hctool.protocol import faultcounts
    from hctool.protocol.faults import IN_RANK

    rows = faultcounts.read(run_dir, [f.spec() for f in faults if f.kind in IN_RANK])
    for row in rows + (fc.counts() if fc is not None else []):
        err.print(f"fault {faultcounts.describe(row)}", markup=False)


def _validate_storage(server_args, run_dir: Path) -> None:
    if server_args.hicache_storage_backend != "file":
        return
    from engine.lab import StorageDirError, check_storage_dir

    try:
        check_storage_dir(server_args.hicache_storage_dir or run_dir / "storage")
    except StorageDirError as exc:
        raise UsageError(str(exc), "pass a writable folder as --hicache-storage-dir") from None


def launch(
    ctx: typer.Context,
    tp: int = typer.Option(1, "--tp", "--tp-size", help="Tensor-parallel ranks (--tp-size: SGLang's name)."),
    pp: int = typer.Option(1, "--pp", "--pp-size", help="Pipeline stages, each --tp ranks (--pp-size: SGLang's name)."),
    dp: int = typer.Option(
        1, "--dp", "--dp-size", help="Data-parallel replicas, each --tp ranks, behind one router (SGLang's --dp-size)."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="HTTP listen address."),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="HTTP port (SGLang's default; 0: pick a free one)."),
    run_dir: Path = typer.Option(
        None, "--run-dir", help="Logs, traces and default storage (default: ./hctool-runs/launch-TIME-PID)."
    ),
    inject: list[str] = typer.Option(
        [],
        "--inject",
        help="A fault (docs/chaos.md): in the ranks, e.g. h2d-sleep:rank=1,ms=30, or from outside them, "
        "e.g. rank-pause:rank=1,start_s=5,ms=2000; repeatable; firing counts at the stop.",
    ),
    probes: list[str] = typer.Option([], "--probes", help="Python module the ranks import at startup (repeatable)."),
    cuda: bool = typer.Option(None, "--cuda/--cpu", help="Device (default: CUDA when there is a GPU per rank)."),
    startup_timeout: float = typer.Option(300.0, "--startup-timeout", help="Seconds to wait for every rank to serve."),
    pd: bool = typer.Option(
        False, "--pd", help="Prefill/decode disaggregation: router + prefill server + decode server."
    ),
    prefill_tp: int = typer.Option(1, "--prefill-tp", help="With --pd: tensor-parallel ranks of the prefill server."),
    decode_tp: int = typer.Option(1, "--decode-tp", help="With --pd: tensor-parallel ranks of the decode server."),
    pd_role: str = typer.Option(
        None, "--pd-role", help="Start one PD part only: prefill or decode (--tp ranks), or router."
    ),
    prefill_url: str = typer.Option(None, "--prefill-url", help="--pd-role router: the prefill server's URL."),
    bootstrap: str = typer.Option(None, "--bootstrap", help="--pd-role router: the prefill's bootstrap HOST:PORT."),
    decode_url: str = typer.Option(None, "--decode-url", help="--pd-role router: the decode server's URL."),
) -> None:
    from engine.lab import ServerArgs
    from hctool.launch import PDTopology, Topology, TopologyError
    from hctool.launch.pd import RouterTopology
    from hctool.supervise.procs import sigterm_as_interrupt

    if pd and tp != 1:
        raise UsageError("--tp does not apply with --pd", "use --prefill-tp and --decode-tp")
    if not pd and (prefill_tp != 1 or decode_tp != 1):
        raise UsageError("--prefill-tp and --decode-tp need --pd")
    if pd and (pp != 1 or dp != 1):
        raise UsageError("--pp and --dp do not apply with --pd", "PD runs TP servers: --prefill-tp and --decode-tp")
    for name, value in (
        ("--tp", tp),
        ("--pp", pp),
        ("--dp", dp),
        ("--prefill-tp", prefill_tp),
        ("--decode-tp", decode_tp),
    ):
        if value < 1:
            raise UsageError(f"{name} must be at least 1")
    if pd_role is not None:
        _check_role(pd_role, pd, prefill_url, bootstrap, decode_url)
    device = _detect_device(cuda, prefill_tp + decode_tp if pd else tp * pp * dp)
    default_dir = run_dir is None
    if default_dir:  # made once the arguments are checked, kept out of git, pruned (console/runs.py)
        run_dir = run_folder_name("launch")
    run_dir = run_dir.resolve()
    for arg in ctx.args:
        if arg.split("=")[0] in LAUNCH_OWNED:
            raise UsageError(f"{arg.split('=')[0]} is set by launch", "use --cuda/--cpu and launch's --run-dir")
    try:
        server_args = ServerArgs.from_cli(
            list(ctx.args), tp_size=tp, pp_size=pp, dp_size=dp, device=device, run_dir=str(run_dir)
        )
        for side_tp in (prefill_tp, decode_tp) if pd else ():
            dataclasses.replace(server_args, tp_size=side_tp)  # validates each side's TP
    except ValueError as exc:
        raise UsageError(str(exc), "see `hctool launch --help` for the engine flags") from None
    faults = _validate_faults(inject)
    if faults and pd_role == "router":
        raise UsageError("--pd-role router runs no ranks: --inject has nothing to act on", "inject on a side's server")
    _validate_storage(server_args, run_dir)
    if not 0 <= port < 65536:
        raise UsageError(f"--port {port} is not a port number")
    if port and not _can_bind(host, port):
        raise UsageError(
            f"port {port} on {host} is in use or not a local address",
            "pick another with --port N, or --port 0 for a free one",
        )
    if default_dir:
        make_run_folder(run_dir, "launch")

    # Faults that act from outside the ranks (rank-pause, rank-kill) are carried out here; their
    # clock, and the ranks', starts when the server is ready.
    from hctool.protocol.faults import IN_RANK
    from hctool.supervise.faults import FaultController

    outside = [f for f in faults if f.kind not in IN_RANK]
    fc = FaultController(outside, run_dir / "fault-clock", history=_FaultNotes()) if outside else None
    fault_env = fc.env() if fc is not None else {}
    if pd_role == "router":
        topology = RouterTopology(prefill_url, bootstrap, decode_url, run_dir, host, port or None)
        what = f"the router (prefill {prefill_url}, decode {decode_url})"
    elif pd_role is not None:
        server_args = dataclasses.replace(server_args, disaggregation_mode=pd_role)
        topology = Topology(
            server_args,
            run_dir,
            faults=faults,
            probes=probes,
            extra_env=fault_env,
            host=host,
            port=port or None,
            label=pd_role,
        )
        what = f"a {pd_role} server: frontend and {tp} rank(s)"
        if pd_role == "prefill":
            err.print(
                f"bootstrap: {server_args.disaggregation_bootstrap_host}:{server_args.disaggregation_bootstrap_port}"
            )
    elif pd:
        topology = PDTopology(
            server_args,
            prefill_tp,
            decode_tp,
            run_dir,
            faults=faults,
            probes=probes,
            extra_env=fault_env,
            host=host,
            port=port or None,
        )
        what = f"router, prefill ({prefill_tp} rank(s)) and decode ({decode_tp} rank(s))"
    else:
        topology = Topology(
            server_args, run_dir, faults=faults, probes=probes, extra_env=fault_env, host=host, port=port or None
        )
        what = f"frontend and {tp * pp * dp} rank(s)" + (f" (dp {dp} x pp {pp} x tp {tp})" if pp * dp > 1 else "")
    err.print(f"run dir: {run_dir}")
    code = 0
    with sigterm_as_interrupt():
        try:
            err.print(f"starting {what} on {device} ...")
            url = topology.start(timeout=startup_timeout)
            err.print("logs: " + " ".join(str(p) for p in topology.log_paths.values()))
            print(f"ready: {url}", flush=True)
            if fc is not None:
                fc.started()
            death = topology.wait_for_death(None if fc is None else 0.2)
            while death is None:  # only with a controller: it acts between the waits
                fc.tick(topology.pids_by_rank())
                death = topology.wait_for_death(0.2)
            _stop(topology)
            _report_death(death)
            code = 1
        except TopologyError as exc:
            _stop(topology)
            if exc.death is not None:
                _report_death(exc.death)
                code = 1
            else:  # nothing died: the ranks were still starting (a slow machine, big pools)
                err.print(f"Error: {exc}", markup=False)
                err.print(f"Hint: raise --startup-timeout (it was {startup_timeout:g} s)", markup=False)
                code = 2
        except KeyboardInterrupt as exc:
            err.print(f"stopping ({str(exc) or 'SIGINT'}) ...")
            _stop(topology)
            err.print("stopped")
        finally:
            if fc is not None:
                fc.release()  # never leave a stopped rank behind
            _stop(topology)  # idempotent; also covers internal errors
            if faults:
                _fault_summary(faults, fc, run_dir)
    raise typer.Exit(code)


def _check_role(role: str, pd: bool, prefill_url, bootstrap, decode_url) -> None:
    if role not in ("prefill", "decode", "router"):
        raise UsageError(f"--pd-role must be prefill, decode or router, got {role!r}")
    if pd:
        raise UsageError("--pd starts every part; --pd-role starts one", "drop one of them")
    given = [prefill_url, bootstrap, decode_url]
    if role == "router" and not all(given):
        raise UsageError("--pd-role router needs --prefill-url, --bootstrap HOST:PORT and --decode-url")
    if role != "router" and any(given):
        raise UsageError("--prefill-url, --bootstrap and --decode-url are for --pd-role router")
    if bootstrap and not bootstrap.rpartition(":")[2].isdigit():
        raise UsageError(f"--bootstrap {bootstrap!r} is not HOST:PORT")


def _can_bind(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _report_death(death) -> None:
    """The dead process's last log lines (its traceback, usually), then one Error line."""
    if death.returncode > 0:
        try:
            tail = death.log_path.read_text(errors="replace").splitlines()[-8:]
        except OSError:
            tail = []
        for line in tail:
            err.print(f"  {death.name} | {line}", markup=False)
    err.print(f"Error: {death.message()}", markup=False)


def _stop(topology) -> None:
    # A second Ctrl-C must not cut the teardown short and leave ranks behind.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    topology.stop()


def register(app: typer.Typer) -> None:
    app.command(
        "launch",
        help=HELP,
        epilog=_engine_flags_help(),
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(launch)
