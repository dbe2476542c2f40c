"""`hctool check-consensus run|analyze`: record every collective on every rank
and name the first divergent one (docs/consensus.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import typer

from hctool.errors import UsageError

RUN_INFO = "hctool-run.json"  # exit codes of a run, so `analyze` later gives the same verdict


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _emit(report: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    from rich.console import Console

    from hctool.consensus.report import render

    render(report, Console(width=None if sys.stdout.isatty() else 160))


def _exit_code(report: dict) -> int:
    return 0 if report["verdict"] == "consistent" else 1


def _default_trace_dir() -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("hctool-runs") / f"consensus-{stamp}-{os.getpid()}"


def run(
    ctx: typer.Context,
    command: list[str] = typer.Argument(None, metavar="-- SCRIPT.py [ARGS] | -- CMD ...",
                                        help="A Python script (started N times) or any command (e.g. torchrun ...)."),
    nproc: int = typer.Option(2, "--nproc", "-n", help="Ranks to start for a SCRIPT.py."),
    timeout: float = typer.Option(120.0, "--timeout", help="Give up (and report) after this many seconds."),
    hang_after: float = typer.Option(5.0, "--hang-after", help="A call blocked this long while a peer is elsewhere is a hang."),
    on_divergence: str = typer.Option("abort", "--on-divergence", help="abort: end the job at the first finding; report: let it run."),
    as_json: bool = typer.Option(False, "--json", help="Print only the JSON report on stdout."),
    trace_dir: Path = typer.Option(None, "--trace-dir", help="Where traces and rank logs go (default: ./hctool-runs/consensus-<time>)."),
) -> None:
    """Run a distributed program with the recorder injected, watch it live, report."""
    from hctool.consensus.run import RunOptions, run_job

    if not command:
        raise UsageError("no program given", "hctool check-consensus run --nproc 2 -- train.py [ARGS]")
    if on_divergence not in ("abort", "report"):
        raise UsageError(f"--on-divergence must be abort or report, not {on_divergence!r}", "use --on-divergence abort")
    if nproc < 1:
        raise UsageError("--nproc must be at least 1", "use --nproc 2")
    if timeout <= 0 or hang_after <= 0:
        raise UsageError("--timeout and --hang-after must be positive", "e.g. --timeout 60 --hang-after 5")
    script_mode = command[0].endswith(".py")
    if script_mode and not Path(command[0]).is_file():
        raise UsageError(f"script not found: {command[0]}", "give the path of a Python file, or a command after --")
    trace_dir = trace_dir or _default_trace_dir()
    if trace_dir.exists() and any(trace_dir.glob("*.jsonl")):
        raise UsageError(f"trace folder already holds traces: {trace_dir}", "pass a new --trace-dir or remove the old one")
    trace_dir.mkdir(parents=True, exist_ok=True)
    _err(f"hctool: traces in {trace_dir}")
    if importlib.util.find_spec("hctool.consensus._fastpath") is None:
        _err("hctool: the recorder's C hot path is not built (no C compiler at `pip install`?): "
             "recording through Python adds ~5-15 us per collective")
    from hctool.consensus.trace import TraceError

    try:
        report, latency = run_job(RunOptions(command=list(command), nproc=nproc, timeout=timeout,
                                             hang_after=hang_after, abort=on_divergence == "abort",
                                             trace_dir=trace_dir, script_mode=script_mode))
    except TraceError as exc:
        raise UsageError(f"the traces of this run cannot be read: {exc}", "was something else writing into --trace-dir?") from None
    if latency is not None:
        _err(f"hctool: reported {latency * 1000:.0f} ms after the first divergent call")
    _emit(report, as_json)
    raise typer.Exit(_exit_code(report))


def analyze(
    path: Path = typer.Argument(..., help="A trace folder of `run`, or a folder of Flight Recorder dumps."),
    as_json: bool = typer.Option(False, "--json", help="Print only the JSON report on stdout."),
) -> None:
    """Analyze traces after the fact (hctool traces or PyTorch Flight Recorder dumps)."""
    from hctool.consensus import analyze_dir

    if not path.is_dir():
        raise UsageError(f"not a folder: {path}", "give the folder that `check-consensus run` printed")
    if not any(path.iterdir()):
        raise UsageError(f"empty folder: {path}", "give a folder with rank*.jsonl traces or Flight Recorder dumps")
    from hctool.consensus.trace import TraceError

    exit_codes, command_exit, ended_at = _run_info(path / RUN_INFO)
    try:
        report = analyze_dir(path, exit_codes=exit_codes, command_exit=command_exit, ended_at=ended_at)
    except TraceError as exc:
        raise UsageError(str(exc), "analyze reads folders written by `check-consensus run` or Flight Recorder dumps") from None
    if report["world_size"] == 0 and command_exit is None:  # a failed run's record alone still says `crashed`
        raise UsageError(f"no traces found in {path}", "expected rank*.jsonl files or Flight Recorder pickles")
    _emit(report, as_json)
    raise typer.Exit(_exit_code(report))


def _run_info(info: Path) -> tuple[dict[int, int | None] | None, int | None, float | None]:
    """Exit codes a `run` left beside its traces and when it ended the ranks still
    running (checked: the folder may come from anyone)."""
    if not info.exists():
        return None, None, None
    hint = "remove it to analyze the traces alone"
    if not info.is_file() or info.is_symlink() or info.stat().st_size > 1 << 20:
        raise UsageError(f"{info}: not a small regular file", hint)
    try:
        data = json.loads(info.read_bytes())
        codes = {int(r): c for r, c in (data.get("exit_codes") or {}).items()}
        command_exit = data.get("command_exit_code")
        ended_at = data.get("ended_at")
        ok = all(0 <= r < 1 << 16 and (c is None or isinstance(c, int)) for r, c in codes.items())
        if not ok or len(codes) > 1 << 16 or not (command_exit is None or isinstance(command_exit, int)):
            raise ValueError("bad exit codes")
        if not (ended_at is None or isinstance(ended_at, (int, float)) and not isinstance(ended_at, bool)):
            raise ValueError("bad ended_at")
    except (ValueError, TypeError, AttributeError) as exc:
        raise UsageError(f"{info}: not a run record ({exc})", hint) from None
    return codes, command_exit, ended_at


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Record every collective on every rank and name the first divergent one.",
                        no_args_is_help=True)
    group.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run)
    group.command("analyze")(analyze)
    app.add_typer(group, name="check-consensus")
