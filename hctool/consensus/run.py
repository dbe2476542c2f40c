"""Supervising a job for `check-consensus run`: start the ranks with the
recorder injected, watch the traces live, and on a finding take the stacks,
end the job and analyze. Every process is reaped on every path."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from hctool.consensus import kernel_build
from hctool.consensus.analyze import analyze_dir
from hctool.consensus.live import LiveWatcher, merge_live
from hctool.consensus.model import Report, Verdict
from hctool.console import log
from hctool.console.paths import tidy_stack_text
from hctool.protocol import env as protocol_env
from hctool.protocol import faultcounts
from hctool.protocol.faults import IN_RANK, Fault
from hctool.protocol.runrecord import RunRecord
from hctool.supervise import procs
from hctool.supervise.faults import FaultController
from hctool.supervise.job import CommandJob, OutputEcho
from hctool.supervise.watch import watch

DEATH_GRACE_S = 2.0  # after a rank hctool started failed: its peers' last records reach the traces


@dataclass
class RunOptions:
    command: list[str]
    nproc: int
    timeout: float
    hang_after: float
    abort: bool
    trace_dir: Path
    script_mode: bool
    faults: tuple[Fault, ...] = ()  # in-rank kinds go to the ranks (HCTOOL_FAULTS), controller kinds run here
    probes: tuple[str, ...] = ()  # pkg.mod:Qual.name function probes (HCTOOL_PROBES)
    controller: FaultController | None = None  # chaos passes its own (heal, history); else one is made for faults
    split_stdout: bool = False  # stdout alone in stdout.log (rank{r}.stdout for a script), for --same-output
    cwd: Path | None = None  # the job's working directory (default: hctool's)
    echo: bool = False  # show the program's output on stderr as it comes (check-consensus run)


def _log(msg: str) -> None:
    log.info(f"hctool: {msg}")


def _c10d_kernel(timeout: float) -> dict[str, str]:
    """HCTOOL_C10D_KERNEL for the ranks: the C++ capture kernel, built for this torch if need be."""
    path, why = kernel_build.ensure_built(log=_log, timeout=timeout)
    if path is None:
        if why != f"{kernel_build.ENV}=0":
            _log(f"C++-issued collectives (DDP's reducer) go through the Python kernel, ~100 us a call: {why}")
        return {}
    return {kernel_build.ENV: str(path)}


def _start(opts: RunOptions, ps: procs.ProcessSet, controller: FaultController | None) -> dict[int, procs.Child]:
    extra = dict(_c10d_kernel(opts.timeout))  # the build counts against the run's --timeout
    # a supervisor's fault anchored at a rank's call goes to the ranks too: the rank says when it is there
    in_rank = [f.spec() for f in opts.faults if f.kind in IN_RANK or f.at_call is not None]
    if in_rank:
        extra[protocol_env.FAULTS] = ";".join(in_rank)
    if opts.probes:
        extra[protocol_env.PROBES] = ",".join(opts.probes)
    if controller is not None:
        extra.update(controller.env())
    base = dict(os.environ)
    if opts.cwd is not None:  # run elsewhere, import as from here: `python -m pkg` finds ./pkg
        base["PYTHONPATH"] = os.pathsep.join(p for p in (base.get("PYTHONPATH"), os.getcwd()) if p)
    env = procs.inject_env(base, TRACE_DIR=str(opts.trace_dir.resolve()), **extra)
    if opts.script_mode:
        # each rank writes its own log: unbuffered, its last lines survive a kill. Not under a
        # wrapper command, whose ranks share one stdout: unbuffered, print() writes the text and
        # its newline apart and two ranks' lines cut into each other ("rank 1 steps 6result
        # steps=6"), which a program does not do without hctool
        env.setdefault("PYTHONUNBUFFERED", "1")
    if not opts.script_mode:
        ps.start(
            "cmd",
            opts.command,
            env=env,
            log_path=opts.trace_dir / "cmd.log",
            stdout_path=opts.trace_dir / "stdout.log" if opts.split_stdout else None,
            cwd=str(opts.cwd) if opts.cwd else None,
        )
        _log(f"started {' '.join(opts.command)} (output in {opts.trace_dir / 'cmd.log'})")
        return {}
    port = procs.free_port()
    ranks = {}
    for r in range(opts.nproc):
        renv = dict(env, **procs.torchrun_env(r, opts.nproc, "127.0.0.1", port))
        ranks[r] = ps.start(
            f"rank{r}",
            procs.python_cmd(*opts.command),
            env=renv,
            log_path=opts.trace_dir / f"rank{r}.log",
            stdout_path=opts.trace_dir / f"rank{r}.stdout" if opts.split_stdout else None,
            cwd=str(opts.cwd) if opts.cwd else None,
        )
    _log(f"started {opts.nproc} ranks of {opts.command[0]} (logs in {opts.trace_dir}/rank*.log)")
    return ranks


def _log_tails(opts: RunOptions, report: Report, log_ends: dict[Path, int]) -> None:
    """The last lines each rank (or the command) logged before hctool ended the job, its paths
    as a reader opens them."""
    logs = sorted(opts.trace_dir.glob("*.log"))
    if len(logs) > 8:
        # a big world: the logs of the ranks the answer names (the culprits, else the first), not 64 tails
        first = report.first_divergence
        named = {str(r) for r in first.culprit_ranks} if first is not None else set()
        keep = [p for p in logs if p.stem.removeprefix("rank") in named] or logs[:1]
        _log(f"{len(logs) - len(keep)} more logs in {opts.trace_dir}")
        logs = keep
    for path in logs:
        with open(path, "rb") as f:
            data = f.read(log_ends[path]) if path in log_ends else f.read()
        lines = tidy_stack_text(data.decode(errors="replace")).splitlines()[-5:]
        if lines:
            cut = " (before hctool ended the job)" if path in log_ends else ""
            _log(f"last lines of {path.name}{cut}:\n  " + "\n  ".join(lines))


@dataclass
class SeenSoFar:
    """What a run stopped from outside (Ctrl-C, SIGTERM, SIGHUP) had seen when it stopped: the
    live watcher's view, read after every process was reaped."""

    seconds: float
    ranks: list[int]  # started or traced
    counts: dict[int, dict[str, int]]  # rank -> op -> calls recorded
    finding: Report | None  # the live check's first finding, if it had one
    trace_dir: Path

    def lines(self) -> list[str]:
        from hctool.consensus.report import counts_line

        out = [f"interrupted after {self.seconds:.1f} s; the job is stopped, every process reaped"]
        if self.ranks:
            calls = counts_line({"counts": {str(r): self.counts.get(r, {}) for r in self.ranks}})
            out.append(f"seen so far: {len(self.ranks)} rank(s); calls per rank: {calls.removeprefix('counts: ')}")
        else:
            out.append("seen so far: no rank had started")
        if self.finding is not None:
            out.append(f"found live: {self.finding.headline()}")
        else:
            out.append("no divergence or hang seen so far")
        out.append(f"traces in {self.trace_dir} (`hctool check-consensus analyze {self.trace_dir}` reads them)")
        return out


class Interrupted(KeyboardInterrupt):
    """A stopping signal ended the run: every process is reaped; `seen` says what it had seen."""

    def __init__(self, seen: SeenSoFar):
        super().__init__("interrupted")
        self.seen = seen


def _seen_so_far(opts: RunOptions, job: CommandJob, watcher: LiveWatcher, started: float) -> SeenSoFar:
    ranks = sorted(set(job.ranks) | set(watcher.reader.ranks) | set(watcher.tracker.counts))
    counts = {r: dict(ops) for r, ops in watcher.tracker.counts.items()}
    return SeenSoFar(time.monotonic() - started, ranks, counts, watcher.finding, opts.trace_dir)


def run_job(opts: RunOptions) -> tuple[Report, float | None]:
    """Returns (report, seconds from the first divergent call to its detection). Stopped by a
    signal (KeyboardInterrupt), it reaps the job, then raises Interrupted with what it had seen."""
    watcher = LiveWatcher(opts.trace_dir, opts.nproc if opts.script_mode else None, hang_after=opts.hang_after)
    started = time.monotonic()
    deadline = started + opts.timeout
    finding = None
    latency = None
    controller = opts.controller or (
        FaultController(opts.faults, opts.trace_dir / "fault-clock") if opts.faults else None
    )
    with procs.sigterm_as_interrupt(), procs.ProcessSet() as ps:
        job = CommandJob(ps, {}, watcher, opts.script_mode)
        echo = OutputEcho(opts.trace_dir, opts.script_mode, log.info) if opts.echo else None
        try:
            try:
                job.ranks = _start(opts, ps, controller)
                if controller is not None:
                    controller.started()
                watched = watch(
                    job,
                    watcher,
                    deadline=deadline,
                    done=lambda: not job.alive(),
                    on_tick=echo,
                    faults=controller,
                    abort=opts.abort,
                    death_grace_s=DEATH_GRACE_S,
                    codes_to_watcher=opts.script_mode,
                    log=_log,
                )
                finding, latency = watched.finding, watched.latency
            finally:
                if controller is not None:
                    controller.release()  # never leave a stopped rank behind
            codes = job.rank_exit_codes()
            command_exit = job.command_exit()  # a wrapper's own code, if it ended by itself (not by hctool below)
            stacks = job.stacks(str(opts.trace_dir)) if job.alive() else {}
            # what ranks still running write from here on (an end record, failed calls) is this teardown's doing
            ended_at = time.monotonic() if job.alive() else None
            # so do the lines they log from here on (torchrun's SignalException for hctool's SIGTERM):
            # the tails shown end where the teardown began
            log_ends = {p: p.stat().st_size for p in opts.trace_dir.glob("*.log")} if ended_at else {}
            if echo is not None:
                echo(final=not ended_at)  # what they wrote up to here (a partial last line, if they ended)
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM, SIGHUP: reap first, then say what was seen
            if echo is not None:
                echo()  # the program's complete lines up to the signal; none of the teardown's
            job.stop()
            raise Interrupted(_seen_so_far(opts, job, watcher, started)) from stop
        job.stop()
    if command_exit and not codes:
        _log(f"the command failed ({procs.describe_exit(command_exit)}) before any rank recorded a collective")
    faults = fault_counts(opts, controller)
    try:
        RunRecord(list(opts.command), codes, command_exit, faults, ended_at, stacks).write(opts.trace_dir)
    except OSError as exc:  # a full folder: the report below still has it all
        _log(f"no run record ({exc.strerror or exc}): a later `analyze` will not know the exit codes")
    report = analyze_dir(opts.trace_dir, exit_codes=codes, stacks=stacks, command_exit=command_exit, ended_at=ended_at)
    report = merge_live(report, finding, stacks)
    if opts.faults:
        report.faults = faults
        for f in faults:
            if not f["total"]:
                _log(f"fault {faultcounts.describe(f)}")
    if report.verdict is not Verdict.CONSISTENT and echo is None:  # echoed: the user has seen it
        _log_tails(opts, report, log_ends)
    return report, latency


def fault_counts(opts: RunOptions, controller: FaultController | None) -> list[dict]:
    """Per fault of the run: how often it fired, per rank (the agents' files, the controller's actions)."""
    in_rank = [f.spec() for f in opts.faults if f.kind in IN_RANK]
    counts = faultcounts.read(opts.trace_dir, in_rank)
    return counts + (controller.counts() if controller is not None else [])
