"""`hctool check-consensus run|analyze`: record every collective on every rank
and name the first divergent one (docs/consensus.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import typer

from hctool.console.errors import UsageError
from hctool.report import write_run_report


def _err(msg: str) -> None:
    from hctool.console import log

    log.info(msg)


def _emit(report, as_json: bool) -> None:
    if as_json:
        from hctool.protocol import strictjson

        print(strictjson.dumps(report.to_json(), indent=2))
        return
    from rich.console import Console

    from hctool.consensus.report import render

    render(report, Console(width=None if sys.stdout.isatty() else 160))


def _exit_code(report) -> int:
    return report.exit_code


def run(
    ctx: typer.Context,
    command: list[str] = typer.Argument(
        None,
        metavar="-- SCRIPT.py [ARGS] | -- CMD ...",
        help="A Python script (started N times) or any command (e.g. torchrun ...).",
    ),
    nproc: int = typer.Option(2, "--nproc", "-n", help="Ranks to start for a SCRIPT.py."),
    timeout: float = typer.Option(120.0, "--timeout", help="Give up (and report) after this many seconds."),
    hang_after: float = typer.Option(
        5.0, "--hang-after", help="A call blocked this long while a peer is elsewhere is a hang."
    ),
    on_divergence: str = typer.Option(
        "abort", "--on-divergence", help="abort: end the job at the first finding; report: let it run."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print only the JSON report on stdout."),
    trace_dir: Path = typer.Option(
        None, "--trace-dir", help="Where traces and rank logs go (default: ./hctool-runs/consensus-<time>)."
    ),
    inject: list[str] = typer.Option(
        [],
        "--inject",
        help="A fault in the ranks, e.g. 'clock-skew:rank=1,ms=500' or "
        "'delay:fn=pkg.mod:Class.method,rank=1,ms=50' (repeatable; docs/chaos.md).",
    ),
    probe: list[str] = typer.Option(
        [],
        "--probe",
        help="Record each entry of this function, pkg.mod:Qual.name "
        "(__main__:name for the script), with its caller (repeatable).",
    ),
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
    _check_command(ctx, list(command))
    faults, probes = checked_faults_and_probes(list(command), inject, probe)
    if trace_dir is None:  # hctool's own folder: kept out of git, the oldest beyond HCTOOL_KEEP_RUNS removed
        from hctool.console.runs import new_run_folder

        trace_dir = new_run_folder("consensus")
    from hctool.supervise import runlock

    runlock.claim(trace_dir, "check-consensus run", refuse_glob="*.jsonl")  # one run per folder, its files only
    _err(f"hctool: traces in {trace_dir}")
    if importlib.util.find_spec("hctool.agent.capture._fastpath") is None:
        _err(
            "hctool: the recorder's C hot path is not built (no C compiler at `pip install`?): "
            "recording through Python adds ~5-15 us per collective"
        )
    from hctool.consensus.run import Interrupted
    from hctool.consensus.trace import TraceError

    try:
        report, latency = run_job(
            RunOptions(
                command=list(command),
                nproc=nproc,
                timeout=timeout,
                hang_after=hang_after,
                abort=on_divergence == "abort",
                trace_dir=trace_dir,
                script_mode=script_mode,
                faults=tuple(faults),
                probes=tuple(probes),
                echo=True,  # the program's output, as torchrun would show it (stderr: stdout is the report)
            )
        )
    except TraceError as exc:
        raise UsageError(
            f"the traces of this run cannot be read: {exc}", "was something else writing into --trace-dir?"
        ) from None
    except Interrupted as stopped:  # the job is reaped: what it had seen, then hctool ends by the signal
        for line in stopped.seen.lines():
            _err(f"hctool: {line}")
        raise
    if latency is not None:
        _err(f"hctool: reported {latency * 1000:.0f} ms after the first divergent call")
    from hctool.consensus.truncation import describe

    for entry in report.incomplete:  # said on stderr with --json too
        _err(f"hctool: {describe(entry)}")
    write_run_report(trace_dir, report.to_json())
    _emit(report, as_json)
    raise typer.Exit(_exit_code(report))


def _check_command(ctx: typer.Context, words: list[str]) -> None:
    """What follows the options must be something to run, checked before a run folder exists: an
    option hctool does not know (a typo, torchrun's) lands here as the first word; so does a
    file that is neither a script nor an executable."""
    import difflib

    first = words[0]
    if first.startswith("-"):
        name = first.split("=", 1)[0]
        known = [o for p in ctx.command.params for o in p.opts if o.startswith("--")]
        if name.replace("_", "-") in ("--nproc-per-node", "--nnodes", "--standalone", "--rdzv-endpoint"):
            hint = "hctool starts a SCRIPT.py's ranks with --nproc N; torchrun's options go after `-- torchrun`"
        else:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}?" if close else "see `hctool check-consensus run --help`"
        raise UsageError(f"no such option: {first}", hint)
    from hctool.supervise.targets import TargetError, parse_target

    try:
        parse_target(words)  # the one rule for what can follow `--` (chaos's command targets too)
    except TargetError as exc:
        raise UsageError(str(exc), "give SCRIPT.py, or a command: torchrun ... train.py, python -m pkg") from None


def checked_faults_and_probes(command: list[str], inject: list[str], probe: list[str]):
    """--inject and --probe of a run on the user's program, checked before anything runs: the
    spec parses, it acts on any program (the engine's kinds need hctool's engine), and every
    named function resolves in the program's source (exit 2 otherwise)."""
    from hctool.protocol.faults import Scope, hint, parse_fault, usable_on
    from hctool.supervise.resolve import check_function
    from hctool.supervise.targets import Command

    main = Command(tuple(command)).main_source()
    faults = []
    for spec in inject:
        try:
            f = parse_fault(spec)
        except ValueError as exc:
            raise UsageError(
                f"bad --inject {spec!r}: {exc}", "see docs/chaos.md for the fault kinds and keys"
            ) from None
        if f.kind not in usable_on(Scope.ANY):
            raise UsageError(
                f"--inject {f.kind} acts on hctool's own engine, not on this program",
                f"for any program: {hint()}",
            )
        if f.fn:
            why = check_function(f.fn, main)
            if why:
                raise UsageError(
                    f"--inject {spec!r}: {why}", "name a function as pkg.mod:Qual.name (__main__:name in the script)"
                )
        faults.append(f)
    for p in probe:
        if ":" not in p:
            raise UsageError(f"bad --probe {p!r}", "name a function as pkg.mod:Qual.name (__main__:name in the script)")
        why = check_function(p, main)
        if why:
            raise UsageError(
                f"--probe {p}: {why}", "name a function as pkg.mod:Qual.name (__main__:name in the script)"
            )
    return faults, list(probe)


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

    exit_codes, command_exit, ended_at, stacks = _run_info(path)
    try:
        report = analyze_dir(path, exit_codes=exit_codes, command_exit=command_exit, ended_at=ended_at, stacks=stacks)
    except TraceError as exc:
        raise UsageError(
            str(exc), "analyze reads folders written by `check-consensus run` or Flight Recorder dumps"
        ) from None
    if (
        report.world_size == 0 and command_exit is None and exit_codes is None
    ):  # a run's record alone still says what it saw
        raise UsageError(f"no traces found in {path}", "expected rank*.jsonl files or Flight Recorder pickles")
    _emit(report, as_json)
    raise typer.Exit(_exit_code(report))


def _run_info(folder: Path) -> tuple[dict[int, int | None] | None, int | None, float | None, dict[str, str] | None]:
    """Exit codes a `run` left beside its traces and when it ended the ranks still running
    (checked: the folder may come from anyone)."""
    from hctool.protocol.runrecord import RunRecord, RunRecordError

    try:
        record = RunRecord.read(folder)
    except RunRecordError as exc:
        raise UsageError(str(exc), "remove it to analyze the traces alone") from None
    if record is None:
        return None, None, None, None
    return record.exit_codes, record.command_exit_code, record.ended_at, record.stacks or None


def export(
    path: Path = typer.Argument(..., help="A run folder: check-consensus run, Flight Recorder dumps, repro or chaos."),
    fmt: str = typer.Option("chrome", "--format", help="chrome: Chrome Trace Event JSON (Perfetto, chrome://tracing)."),
    output: str = typer.Option(None, "--output", "-o", help="Write to this file (default: stdout, not a terminal)."),
    run_name: str = typer.Option(
        None, "--run", help="In a repro or chaos folder: the variant or run (default: the first not clean)."
    ),
    limit: int = typer.Option(
        None,
        "--max-calls-per-rank",
        min=1,
        help="Keep at most this many calls per rank (default 20,000; fewer beyond 20 ranks).",
    ),
) -> None:
    """Export a run's timeline: a track per rank and group, a slice per call, arrows between paired calls."""
    from hctool.consensus.trace import TraceError
    from hctool.report.export import export_folder
    from hctool.report.folders import FolderError

    if fmt != "chrome":
        raise UsageError(f"unknown format {fmt!r}", "use --format chrome")
    to_stdout = output in (None, "-")
    if to_stdout and sys.stdout.isatty():
        raise UsageError("the trace is JSON for a viewer, not for a terminal", "add -o trace.json")
    try:
        doc, chosen = export_folder(path, run_name, limit)
    except (FolderError, TraceError) as exc:
        raise UsageError(str(exc), "give a folder that check-consensus run, repro or chaos wrote") from None
    from hctool.protocol import strictjson

    text = strictjson.dumps(doc, separators=(",", ":"))  # strict JSON whatever the traces hold
    if to_stdout:
        sys.stdout.write(text + "\n")
    else:
        try:
            Path(output).write_text(text + "\n")
        except OSError as exc:
            raise UsageError(f"cannot write {output}: {exc.strerror}", "pick a writable path for -o") from None
    from hctool.console import log

    info = doc["otherData"]["hctool"]
    seen, kept = sum(info["calls_seen"].values()), sum(info["calls_kept"].values())
    log.info(
        f"hctool: {chosen.name}: {kept} of {seen} calls"
        + (f" (thinned: {info['rule']})" if kept < seen else "")
        + ("" if to_stdout else f" in {output}")
        + "; open it in ui.perfetto.dev or chrome://tracing"
    )


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="Record every collective on every rank and name the first divergent one.", no_args_is_help=True
    )
    group.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run)
    group.command("analyze")(analyze)
    group.command("export")(export)
    app.add_typer(group, name="check-consensus")
