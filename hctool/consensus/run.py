"""Supervising a job for `check-consensus run`: start the ranks with the
recorder injected, watch the traces live, and on a finding take the stacks,
end the job and analyze. Every process is reaped on every path."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from hctool import log, procs
from hctool.consensus import kernel_build
from hctool.consensus.analyze import analyze_dir
from hctool.consensus.live import LiveWatcher, _alive
from hctool.consensus.model import Kind, Report, Verdict
from hctool.protocol import env as protocol_env
from hctool.protocol import faultcounts
from hctool.protocol.faults import IN_RANK, Fault
from hctool.protocol.runrecord import RunRecord
from hctool.stacks import dump_stacks, ranks_in_tree
from hctool.supervise.faults import FaultController

POLL_S = 0.2
DEATH_GRACE_S = 2.0  # after a rank failed: its peers' last records reach the traces, their stacks are taken


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
    in_rank = [f.spec() for f in opts.faults if f.kind in IN_RANK]
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


def _exit_codes(opts: RunOptions, ranks: dict[int, procs.Child], watcher: LiveWatcher) -> dict[int, int | None]:
    """Per rank: exit code, or None while alive. Under a wrapper command the
    ranks' own codes are unknown: an end record means 0 (or 1 after an uncaught
    exception), a vanished process without one means it was killed (-9)."""
    if opts.script_mode:
        return {r: c.popen.poll() for r, c in ranks.items()}
    out: dict[int, int | None] = {}
    for r, rt in watcher.reader.ranks.items():
        if _alive(rt.pid):
            out[r] = None
        else:
            out[r] = {"clean": 0, "crashed": 1}.get(rt.ended, -9)
    return out


def _stacks(opts: RunOptions, ps: procs.ProcessSet, ranks, watcher: LiveWatcher) -> dict[str, str]:
    pids: dict[int, int | list[int]] = {}
    if opts.script_mode:
        pids = {r: c.popen.pid for r, c in ranks.items() if c.popen.poll() is None}
    else:
        for child in ps.alive():
            pids.update(ranks_in_tree(child.popen.pid))
        pids.update({r: p for r, p in watcher.pids().items() if _alive(p)})
    if not pids:
        return {}
    return dump_stacks(pids, timeout=5.0, trace_dir=str(opts.trace_dir))


def _log_tails(opts: RunOptions, report: Report) -> None:
    logs = sorted(opts.trace_dir.glob("*.log"))
    if len(logs) > 8:
        # a big world: the logs of the ranks the answer names (the culprits, else the first), not 64 tails
        first = report.first_divergence
        named = {str(r) for r in first.culprit_ranks} if first is not None else set()
        keep = [p for p in logs if p.stem.removeprefix("rank") in named] or logs[:1]
        _log(f"{len(logs) - len(keep)} more logs in {opts.trace_dir}")
        logs = keep
    for path in logs:
        lines = path.read_text(errors="replace").splitlines()[-5:]
        if lines:
            _log(f"last lines of {path.name}:\n  " + "\n  ".join(lines))


def run_job(opts: RunOptions) -> tuple[Report, float | None]:
    """Returns (report, seconds from the first divergent call to its detection)."""
    watcher = LiveWatcher(opts.trace_dir, opts.nproc if opts.script_mode else None, hang_after=opts.hang_after)
    deadline = time.monotonic() + opts.timeout
    finding = None
    latency = None
    controller = opts.controller or (
        FaultController(opts.faults, opts.trace_dir / "fault-clock") if opts.faults else None
    )
    with procs.sigterm_as_interrupt(), procs.ProcessSet() as ps:
        try:
            ranks = _start(opts, ps, controller)
            if controller is not None:
                controller.started()
            finding, latency = _watch(opts, ps, ranks, watcher, controller, deadline)
        finally:
            if controller is not None:
                controller.release()  # never leave a stopped rank behind
        codes = _exit_codes(opts, ranks, watcher)
        # a wrapper command's own exit code, if it ended by itself (not by hctool below)
        command_exit = None if opts.script_mode or not ps.children else ps.children[0].popen.poll()
        stacks = _stacks(opts, ps, ranks, watcher) if ps.alive() else {}
        # what ranks still running write from here on (an end record, failed calls) is this teardown's doing
        ended_at = time.monotonic() if ps.alive() else None
        ps.terminate_all()
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
    if report.verdict is not Verdict.CONSISTENT:
        _log_tails(opts, report)
    return report, latency


def merge_live(final: Report, live: Report | None, stacks: dict[str, str]) -> Report:
    """The report of a run: the final analysis of every trace, except what ending the job took
    away from it. A finding seen live stands if the final data lost it (a consistent or an
    unseen verdict), and a wait cycle seen live stays on the finding it explains (ending the
    job broke the cycle the final data would show)."""
    if live is None:
        return final
    if (final.verdict is Verdict.CONSISTENT or not final.verdict.seen) and live.first_divergence is not None:
        live.stacks, live.exit_codes = stacks, final.exit_codes
        live.command_exit_code, live.coverage = final.command_exit_code, final.coverage
        return live
    lf, ff = live.first_divergence, final.first_divergence
    if lf is not None and lf.deadlock and (ff is None or not ff.deadlock):
        if lf.kind is Kind.WAIT_CYCLE:
            final.verdict, final.first_divergence = live.verdict, lf
        elif ff is not None and (lf.group, lf.seq) == (ff.group, ff.seq):
            ff.deadlock, ff.cycle = lf.deadlock, lf.cycle
    return final


def _watch(opts: RunOptions, ps: procs.ProcessSet, ranks, watcher: LiveWatcher, controller, deadline: float):
    """Until everything exited, the deadline, (with abort) the first finding, or (ranks hctool
    started itself) DEATH_GRACE_S after a rank failed: as torchrun ends a job whose worker
    failed, for its peers can only block on it. (finding, latency)."""
    finding = latency = None
    failed_at = None
    while True:
        codes = _exit_codes(opts, ranks, watcher)
        everything_exited = not ps.alive()
        if opts.script_mode and failed_at is None and any(c not in (None, 0) for c in codes.values()):
            failed_at = time.monotonic()
            dead = ", ".join(f"rank {r} ({procs.describe_exit(c)})" for r, c in codes.items() if c not in (None, 0))
            _log(f"{dead} failed: ending the job in {DEATH_GRACE_S:g} s, as torchrun would")
        live = watcher.check(codes if opts.script_mode else None)
        if controller is not None:
            controller.tick(_rank_pids(opts, ranks, watcher))
        if live is not None and finding is None:
            finding = live
            latency = watcher.latency_s()
            _log(live.headline())
            if opts.abort:
                break
        if everything_exited:
            break
        if failed_at is not None and time.monotonic() - failed_at > DEATH_GRACE_S:
            break
        if time.monotonic() > deadline:
            _log(f"timeout after {opts.timeout:.0f} s")
            break
        time.sleep(POLL_S)
    return finding, latency


def _rank_pids(opts: RunOptions, ranks, watcher: LiveWatcher) -> dict[int, int]:
    """Each live rank's pid: our own children for a script, the traces' headers under a command."""
    if opts.script_mode:
        return {r: c.popen.pid for r, c in ranks.items() if c.popen.poll() is None}
    return {r: p for r, p in watcher.pids().items() if _alive(p)}


def fault_counts(opts: RunOptions, controller: FaultController | None) -> list[dict]:
    """Per fault of the run: how often it fired, per rank (the agents' files, the controller's actions)."""
    in_rank = [f.spec() for f in opts.faults if f.kind in IN_RANK]
    counts = faultcounts.read(opts.trace_dir, in_rank)
    return counts + (controller.counts() if controller is not None else [])
