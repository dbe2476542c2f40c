"""`hctool chaos run | explore | shrink | merge`: fault schedules against a real
engine run, invariant checks, shrinking, replay, CI shards (docs/chaos.md)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from pathlib import Path

import typer

from hctool.console import log
from hctool.console.errors import UsageError
from hctool.report import write_run_report

app = typer.Typer(
    no_args_is_help=True, help="Chaos testing: random fault schedules, invariants, shrinking (docs/chaos.md)."
)
EXTRA = {"allow_extra_args": True, "ignore_unknown_options": False}
EXIT = {"valid": 0, "invalid": 1, "unknown": 2}

ScenarioOpt = typer.Option(None, "--scenario", help="Run a repro scenario's engine configuration and workload.")
VariantOpt = typer.Option(None, "--variant", help="The scenario's variant (default: its first).")
NoFaultsOpt = typer.Option(False, "--no-scenario-faults", help="Leave the scenario's own faults out.")
CatalogueOpt = typer.Option([], "--catalogue", help="Also load scenarios from this folder.")
JsonOpt = typer.Option(False, "--json", help="Print only the JSON report on stdout.")
ArtifactsOpt = typer.Option(None, "--artifacts", help="Run directory (default ./hctool-runs/chaos-TIME).")
RoundsOpt = typer.Option(
    2, "--rounds", min=1, help="Workload rounds per run (caps the scenario's; fewer rounds, more schedules per minute)."
)
HangOpt = typer.Option(
    None,
    "--hang-after",
    min=0.1,
    max=86400,
    help="Seconds a collective may block while a peer is elsewhere before it is a hang (default 10: above what "
    "one schedule's delays add up to; replay commands carry it).",
)
StarveOpt = typer.Option(1000, "--starve-ticks", min=1, help="Liveness: ticks with work waiting and nothing running.")


NprocOpt = typer.Option(2, "--nproc", "-n", help="Ranks to start for a -- SCRIPT.py target.")
TimeoutOpt = typer.Option(None, "--timeout", help="A command target: seconds one run may take (default 300).")
SameOutputOpt = typer.Option(
    None,
    "--same-output",
    help="A command target: stdout lines matching this regex must equal those of the fault-free run.",
)


def _target(
    ctx: typer.Context,
    scenario,
    variant,
    no_faults,
    catalogue,
    rounds: int | None = None,
    hang_after: float | None = None,
    nproc: int = 2,
    timeout: float | None = None,
    same_output: str | None = None,
):
    """--scenario ID, or what follows `--`: engine flags (start with -) or a command (anything else)."""
    import re

    from hctool.chaos.target import CHAOS_HANG_AFTER_S, launch_target, scenario_target
    from hctool.repro.scenario import ScenarioError
    from hctool.supervise.targets import TargetError

    hang_after = CHAOS_HANG_AFTER_S if hang_after is None else hang_after
    flags = list(ctx.args)
    try:
        if scenario and flags:
            raise UsageError("give either --scenario or a target after --, not both")
        if scenario:
            return scenario_target(scenario, variant, no_faults, catalogue, rounds, hang_after)
        if flags and not flags[0].startswith("-"):
            from hctool.chaos.command import command_target

            return command_target(flags, nproc, hang_after, timeout, same_output, CHAOS_HANG_AFTER_S)
        if same_output is not None or timeout is not None:
            raise UsageError(
                "--same-output and --timeout are for a command target", "hctool chaos explore -- torchrun ..."
            )
        if flags:
            return launch_target(flags, hang_after=hang_after)
    except ScenarioError as exc:
        raise UsageError(str(exc), "see `hctool repro list` and `hctool launch --help`") from None
    except TargetError as exc:
        raise UsageError(
            str(exc), "after -- give a command (torchrun ..., python -m ..., SCRIPT.py) or engine flags"
        ) from None
    except re.error as exc:
        raise UsageError(f"bad --same-output regex: {exc}", "e.g. --same-output '^loss'") from None
    raise UsageError(
        "no target",
        "give --scenario ID [--variant V], `-- ENGINE-FLAGS` (as for hctool launch), "
        "or `-- CMD` (your program: torchrun ..., SCRIPT.py)",
    )


def _check_kinds(target, kinds) -> None:
    """The engine's kinds act through hctool's engine only: refused against a command."""
    from hctool.protocol.faults import hint, usable_on

    bad = sorted({k for k in kinds if k not in usable_on(target.scope)})
    if bad:
        raise UsageError(
            f"fault kind {bad[0]} acts on hctool's own engine, not on a command", f"for a program: {hint(target.scope)}"
        )


def _check_names(target, faults) -> None:
    """A by-name fault of a schedule names a function of the program: checked before anything runs."""
    for f in faults:
        why = target.unresolved(f)
        if why:
            raise UsageError(
                f"schedule fault {f.spec()}: {why}",
                "name a function as pkg.mod:Qual.name (__main__:name in the script)",
            )


@contextlib.contextmanager
def _clean_without_faults(as_json: bool = False):
    """Around the fault-free run (a command) or setup + reference (the engine): a program that
    fails with no fault at all is a finding in its own right (exit 1, as an anomaly would be),
    not a usage error; nothing is explored on top of it."""
    from hctool.chaos.command import ChaosSetupError

    try:
        yield
    except ChaosSetupError as exc:
        if as_json:
            print(json.dumps({"verdict": "invalid", "without_faults": True, "reason": str(exc)}))
        else:
            print(f"INVALID without any fault: {exc}")
        log.info("chaos: nothing explored on top of it; `hctool check-consensus run` shows the run whole")
        raise typer.Exit(1) from None


def _setup(artifacts: Path | None, what: str):
    from hctool.chaos.history import History
    from hctool.console.runs import new_run_folder
    from hctool.supervise import runlock

    # a folder of hctool-runs/ is marked as hctool's and counts toward HCTOOL_KEEP_RUNS (the oldest
    # chaos runs go: four small explorations made 159 MB); --artifacts is the user's, never pruned
    root = Path(artifacts) if artifacts else new_run_folder("chaos", f"chaos-{what}")
    runlock.claim(root, f"chaos {what}", refuse_glob="*")  # one run per folder: refused if another holds it
    log.info(f"chaos {what}: artifacts in {root}")
    return root, History(root / "history.jsonl")


def _schedule(path: Path):
    from hctool.chaos.schedule import ScheduleError, load_schedule

    try:
        return load_schedule(path)
    except ScheduleError as exc:
        raise UsageError(str(exc), "see docs/chaos.md for the schedule format") from None


def _finish(report: dict, root: Path, as_json: bool, exit_code: int | None = None) -> None:
    (root / "report.json").write_text(json.dumps(report, indent=2, default=str))
    write_run_report(root, report)
    if as_json:
        print(json.dumps(report, indent=2, default=str))
    else:
        from rich.console import Console

        from hctool.chaos.report import render

        render(report, Console(width=None if sys.stdout.isatty() else 160))
    raise typer.Exit(EXIT[report["verdict"]] if exit_code is None else exit_code)


AcceptOpt = typer.Option(
    "5/5", "--accept", help="Shrinking keeps a reduction only if it reproduces in K of N runs (K/N)."
)


def _accept(text: str) -> tuple[int, int]:
    try:
        need, tries = (int(x) for x in text.split("/"))
        if not 1 <= need <= tries:
            raise ValueError
    except ValueError:
        raise UsageError(f"bad --accept {text!r}", "use --accept K/N with 1 <= K <= N, e.g. 5/5") from None
    return need, tries


def _shrink_and_replay(
    runner,
    target,
    sched,
    anomaly,
    root: Path,
    shrink_budget: float,
    replays: int,
    k: int,
    accept: tuple[int, int] = (5, 5),
    min_rate: float = 0.8,
    deadline: float | None = None,
    run: str | None = None,
    fired: dict[str, int] | None = None,
):
    """Shrink, then replay; with a `deadline` (monotonic: explore's budget) both stop there."""
    from hctool.chaos.explore import replay_trail, shrink
    from hctool.chaos.report import anomaly_entry, replay_command

    # `one` is resolved first: it picks its rank from the fault's text, so a shrink step
    # that changed the text (start 0, half the ms) would move the fault to another rank.
    sched = found = sched.with_faults(f.resolved(runner.world_size, sched.seed) for f in sched.faults)
    trail = [sched]
    # a fault that never acted in the run that found the anomaly had no part in it: it goes
    # without a run (its spec is the one the run counted: resolved as above)
    acted = [f for f in sched.faults if (fired or {}).get(f.spec(), 1) > 0]
    if acted and len(acted) < len(sched.faults):
        idle = [f.spec() for f in sched.faults if f not in acted]
        log.info(f"chaos: dropped {len(idle)} fault(s) that never acted in run {run}: {'; '.join(idle)}")
        sched = sched.with_faults(acted)
        trail.append(sched)
    if deadline is not None:  # half of what is left shrinks, the rest replays: a rate is half the finding
        left = max(0.0, deadline - time.monotonic())
        shrink_budget = min(shrink_budget, left / 2 if replays else left)
    if shrink_budget > 0:
        res = shrink(runner, sched, anomaly.invariant, shrink_budget, need=accept[0], tries=accept[1])
        trail = trail[:-1] + res.trail  # res.trail starts with its input, trail's last
        log.info(
            f"chaos: shrunk to {len(res.schedule.faults)} fault(s) in {res.attempts} attempt(s): "
            f"{'; '.join(res.schedule.specs())}"
        )
    need = math.ceil(min_rate * replays)
    replayed = replay_trail(runner, trail, anomaly.invariant, replays, need, deadline) if replays else []
    if replays and not replayed:
        log.info("chaos: no replay: the budget was spent (--budget covers exploring, shrinking and replaying)")
    final = replayed[-1].schedule if replayed else trail[-1]
    path = root / f"anomaly-{k}.toml"
    path.write_text(final.to_toml())
    entry = anomaly_entry(
        anomaly,
        found,
        replay_command(path, target),
        final if final != found else None,
        f"{replayed[-1].hits}/{replayed[-1].runs}" if replayed else None,
        run=run,
    )
    if len(replayed) > 1:  # the steps backed off, for the record
        entry["replayed"] = [{"schedule": r.schedule.specs(), "reproduced": f"{r.hits}/{r.runs}"} for r in replayed]
    return entry


@app.command("run", context_settings=EXTRA)
def run_cmd(
    ctx: typer.Context,
    schedule: Path = typer.Argument(..., help="Schedule TOML (docs/chaos.md)."),
    scenario: str = ScenarioOpt,
    variant: str = VariantOpt,
    no_scenario_faults: bool = NoFaultsOpt,
    catalogue: list[Path] = CatalogueOpt,
    runs: int = typer.Option(1, "--runs", min=1, help="Run it K times."),
    rounds: int = typer.Option(
        None, "--rounds", min=1, help="Cap the scenario's workload rounds (replay commands carry it)."
    ),
    as_json: bool = JsonOpt,
    artifacts: Path = ArtifactsOpt,
    starve_ticks: int = StarveOpt,
    hang_after: float = HangOpt,
    nproc: int = NprocOpt,
    timeout: float = TimeoutOpt,
    same_output: str = SameOutputOpt,
) -> None:
    """Run one schedule against a target (K times); exit 0 valid, 1 invalid, 2 could not run."""
    from hctool.chaos.report import anomaly_entry, build, replay_command
    from hctool.supervise.procs import sigterm_as_interrupt

    target = _target(
        ctx, scenario, variant, no_scenario_faults, catalogue, rounds, hang_after, nproc, timeout, same_output
    )
    sched = _schedule(schedule)
    _check_kinds(target, [f.kind for f in sched.faults])
    _check_names(target, sched.faults)
    root, history = _setup(artifacts, "run")
    runner = target.runner(root, history, starve_ticks)
    with sigterm_as_interrupt():
        with _clean_without_faults(as_json):
            runner.prepare()
        results = [(sched, runner.run(sched, f"run{k + 1}")) for k in range(runs)]
    invariants = sorted({a.invariant for _, r in results for a in r.anomalies})
    anomalies = []
    for inv in invariants:
        first = next(a for _, r in results for a in r.anomalies if a.invariant == inv)
        hits = sum(any(a.invariant == inv for a in r.anomalies) for _, r in results)
        anomalies.append(anomaly_entry(first, sched, replay_command(schedule, target, runs), None, f"{hits}/{runs}"))
    _finish(build(target, sched.seed, results, anomalies, history.path), root, as_json)


@app.command("explore", context_settings=EXTRA)
def explore_cmd(
    ctx: typer.Context,
    scenario: str = ScenarioOpt,
    variant: str = VariantOpt,
    no_scenario_faults: bool = NoFaultsOpt,
    catalogue: list[Path] = CatalogueOpt,
    rounds: int = RoundsOpt,
    budget: float = typer.Option(
        600.0,
        "--budget",
        min=1,
        help="Seconds for all of it: setup, exploring, shrinking and replaying (a run under way finishes).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the schedule generator."),
    shard: str = typer.Option("1/1", "--shard", help="i/N: this machine's share of the schedules."),
    kinds: str = typer.Option(
        None,
        "--kinds",
        help="Comma-separated fault kinds (default: the engine's kinds and "
        "rank-pause for the engine; the generic kinds for a command; never rank-kill).",
    ),
    max_schedules: int = typer.Option(None, "--max-schedules", min=1, help="Stop after this many schedules."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Do not stop at the first anomaly."),
    shrink_budget: float = typer.Option(
        600.0, "--shrink-budget", min=0, help="At most this much of --budget for shrinking (0: none)."
    ),
    replays: int = typer.Option(
        10, "--replays", min=0, help="Replays of the (shrunk) schedule (its reproduction rate)."
    ),
    accept: str = AcceptOpt,
    horizon: float = typer.Option(
        None,
        "--horizon",
        min=1,
        help="Faults start within this many seconds (default: the engine's no-cache reference workload's "
        "length; a command's faults are anchored to the collectives of its fault-free run instead). "
        "The heal comes when the workload is done.",
    ),
    as_json: bool = JsonOpt,
    artifacts: Path = ArtifactsOpt,
    starve_ticks: int = StarveOpt,
    hang_after: float = HangOpt,
    nproc: int = NprocOpt,
    timeout: float = TimeoutOpt,
    same_output: str = SameOutputOpt,
) -> None:
    """Random schedules until an anomaly or the budget; then shrink and replay it."""
    from hctool.chaos.explore import explore
    from hctool.chaos.report import build
    from hctool.chaos.schedule import ScheduleError, parse_kinds
    from hctool.console import progress
    from hctool.protocol.faults import drawn_for
    from hctool.supervise.procs import sigterm_as_interrupt

    target = _target(
        ctx, scenario, variant, no_scenario_faults, catalogue, rounds, hang_after, nproc, timeout, same_output
    )
    try:
        i, n = (int(x) for x in shard.split("/"))
        if not 1 <= i <= n:
            raise ValueError
    except ValueError:
        raise UsageError(f"bad --shard {shard!r}", "use --shard i/N with 1 <= i <= N") from None
    try:
        kind_list = parse_kinds(kinds, drawn_for(target.scope))
    except ScheduleError as exc:
        raise UsageError(str(exc), "see `hctool chaos explore --help` and docs/chaos.md for the kinds") from None
    need_tries = _accept(accept)
    _check_kinds(target, kind_list)
    root, history = _setup(artifacts, "explore")
    # No --horizon: the engine's faults start within its reference workload's length; a command's
    # are anchored to calls of its fault-free run (schedule.generate)
    runner = target.runner(root, history, starve_ticks, target.default_horizon_s if horizon is None else horizon)
    anomalous = []

    def show(k: int, t: float, verdict: str) -> None:  # schedules run, anomalies, budget left
        anomalous.append(verdict == "invalid")
        bar.update(
            completed=min(t, budget),
            text=f"{k} schedules, {sum(anomalous)} anomalous, {max(0.0, budget - t):.0f} s of budget left",
        )

    # The budget bounds everything explore does: setup, exploring, shrinking and replaying (the
    # run under way when it ends finishes: at most one schedule's length over).
    deadline = time.monotonic() + budget
    with (
        sigterm_as_interrupt(),
        progress.task("chaos explore", total=budget, text="setting up") as bar,
        _clean_without_faults(as_json),
    ):
        found = explore(runner, seed, budget, (i, n), kind_list, max_schedules, keep_going, show)
    anomalies = []
    interrupted = found.interrupted
    for sched, res in found.runs:
        for a in res.anomalies[:1] if res.anomalies else []:
            if interrupted:  # what was found stays found; shrinking and replaying are what was cut
                anomalies.append(_unshrunk(a, sched, root, target, len(anomalies) + 1, res.name))
                continue
            try:
                with sigterm_as_interrupt():
                    anomalies.append(
                        _shrink_and_replay(
                            runner,
                            target,
                            sched,
                            a,
                            root,
                            shrink_budget,
                            replays,
                            len(anomalies) + 1,
                            need_tries,
                            deadline=deadline,
                            run=res.name,
                            fired=res.fired,
                        )
                    )
            except KeyboardInterrupt:
                interrupted = True
                log.info("chaos: interrupted while shrinking or replaying")
                anomalies.append(_unshrunk(a, sched, root, target, len(anomalies) + 1, res.name))
    minutes = found.seconds / 60
    report = build(
        target,
        seed,
        found.runs,
        anomalies,
        history.path,
        shard=shard,
        seconds=round(found.seconds, 1),
        first_anomaly_s=None if found.first_anomaly_s is None else round(found.first_anomaly_s, 1),
        schedules_per_min=round(len(found.runs) / minutes, 2) if minutes else None,
    )
    if interrupted:
        report["interrupted"] = True
        log.info(
            f"chaos explore: interrupted: {len(found.runs)} schedule(s) ran, "
            f"{sum(bool(r.anomalies) for _, r in found.runs)} anomalous; the report covers those"
        )
    _finish(report, root, as_json, exit_code=130 if interrupted else None)


def _unshrunk(anomaly, sched, root: Path, target, k: int, run: str) -> dict:
    """An anomaly as found, not shrunk or replayed (the exploration was interrupted)."""
    from hctool.chaos.report import anomaly_entry, replay_command

    path = root / f"anomaly-{k}.toml"
    path.write_text(sched.to_toml())
    return anomaly_entry(anomaly, sched, replay_command(path, target), None, None, run=run)


@app.command("shrink", context_settings=EXTRA)
def shrink_cmd(
    ctx: typer.Context,
    schedule: Path = typer.Argument(..., help="A failing schedule TOML."),
    scenario: str = ScenarioOpt,
    variant: str = VariantOpt,
    no_scenario_faults: bool = NoFaultsOpt,
    catalogue: list[Path] = CatalogueOpt,
    rounds: int = typer.Option(None, "--rounds", min=1, help="Cap the scenario's workload rounds."),
    invariant: str = typer.Option(
        None, "--invariant", help="The invariant that must keep failing (default: the first seen)."
    ),
    budget: float = typer.Option(600.0, "--budget", min=1, help="Seconds for shrinking."),
    replays: int = typer.Option(10, "--replays", min=0, help="Replays of the shrunk schedule (its reproduction rate)."),
    accept: str = AcceptOpt,
    as_json: bool = JsonOpt,
    artifacts: Path = ArtifactsOpt,
    starve_ticks: int = StarveOpt,
    hang_after: float = HangOpt,
    nproc: int = NprocOpt,
    timeout: float = TimeoutOpt,
    same_output: str = SameOutputOpt,
) -> None:
    """Reduce a failing schedule to the fewest, smallest faults that still fail."""
    from hctool.chaos.invariants import Anomaly
    from hctool.chaos.report import build
    from hctool.supervise.procs import sigterm_as_interrupt

    need_tries = _accept(accept)
    target = _target(
        ctx, scenario, variant, no_scenario_faults, catalogue, rounds, hang_after, nproc, timeout, same_output
    )
    sched = _schedule(schedule)
    _check_kinds(target, [f.kind for f in sched.faults])
    _check_names(target, sched.faults)
    checkers = target.checkers
    if invariant is not None and invariant not in checkers:  # before anything is written
        raise UsageError(f"unknown invariant {invariant!r}", f"known: {', '.join(checkers)}")
    root, history = _setup(artifacts, "shrink")
    runner = target.runner(root, history, starve_ticks)
    with sigterm_as_interrupt():
        with _clean_without_faults(as_json):
            runner.prepare()
        first = runner.run(sched, "original")
        seen = [a for a in first.anomalies if invariant in (None, a.invariant)]
        anomaly = (
            seen[0] if seen else (Anomaly(invariant, {"note": "not seen in the first run"}) if invariant else None)
        )
        anomalies = (
            []
            if anomaly is None
            else [_shrink_and_replay(runner, target, sched, anomaly, root, budget, replays, 1, need_tries)]
        )
    _finish(build(target, sched.seed, [(sched, first)], anomalies, history.path), root, as_json)


@app.command("merge")
def merge_cmd(
    reports: list[Path] = typer.Argument(..., help="Chaos reports (--json output or report.json) of shards."),
    as_json: bool = JsonOpt,
) -> None:
    """Join the reports of CI shards into one; exit as the merged verdict."""
    from hctool.chaos.report import load_report, merge, merge_problem

    try:
        loaded = [load_report(p) for p in reports]
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read a report: {exc}", "pass the files written by chaos explore --json") from None
    problem = merge_problem(loaded)
    if problem:
        raise UsageError(problem, "merge the shards of one exploration (explore --shard i/N, one seed, one target)")
    merged = merge(loaded)
    if as_json:
        print(json.dumps(merged, indent=2, default=str))
    else:
        from rich.console import Console

        from hctool.chaos.report import render

        render(merged, Console(width=None if sys.stdout.isatty() else 160))  # as _finish: not 80 columns in a pipe
    raise typer.Exit(EXIT[merged["verdict"]])


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="chaos")
