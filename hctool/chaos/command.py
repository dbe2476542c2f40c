"""Chaos on the user's program: a command target (`-- torchrun ... train.py`, `-- SCRIPT.py`)
run under `check-consensus run`'s supervision with a schedule's faults, and its invariants:

  consensus  no divergent collective (the recorder's traces, live and after the fact)
  liveness   no collective blocked past --hang-after while a peer is elsewhere, the job ends
             within --timeout
  exits      every rank exits 0 (a rank the schedule killed is not a failure: the run is unknown)
  output     with --same-output REGEX: the stdout lines matching REGEX are those of the fault-free
             run (as a multiset: ranks interleave their output in any order)

The fault-free run comes first (prepare): it must itself be clean, and its length is the
horizon the schedules' windows are drawn in unless --horizon says otherwise."""

from __future__ import annotations

import re
import shlex
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from hctool.chaos.history import History
from hctool.chaos.invariants import Anomaly
from hctool.chaos.runner import RunResult, fired_totals
from hctool.chaos.schedule import Activity, Schedule
from hctool.consensus.model import Confidence, Kind, Report, Verdict
from hctool.protocol.faults import Fault, Scope
from hctool.supervise.targets import Command

COMMAND_CHECKERS = ("consensus", "liveness", "exits", "output")
DEFAULT_TIMEOUT_S = 300.0


def consensus_evidence(report: Report) -> dict:
    """A consensus finding as an anomaly's evidence (JSON): the cause line first."""
    first = report.first_divergence
    return {
        "verdict": report.verdict.value,
        "cause": first.cause_line() if first else report.reason,
        "symptom": first.symptom_line() if first else None,
        "first_divergence": first.to_json() if first else None,
        "counts": report.counts,
    }


def activity_of(folder: Path, launched_wall: float) -> Activity | None:
    """Each rank's recorded collectives in a finished run's traces, and the seconds after launch
    of the first and the last of them (None: it recorded none)."""
    from hctool.consensus.trace import TraceDirReader, TraceError

    calls: Counter = Counter()
    first = last = None
    try:
        for ev in TraceDirReader(str(folder)).poll():
            if ev.get("op") is None or not isinstance(ev.get("w"), float):
                continue
            calls[int(ev["rank"])] += 1
            first = ev["w"] if first is None else min(first, ev["w"])
            last = ev["w"] if last is None else max(last, ev["w"])
    except (OSError, TraceError):
        return None
    if not calls or first is None or last is None:
        return None
    return Activity(dict(calls), round(max(0.0, first - launched_wall), 2), round(max(0.0, last - launched_wall), 2))


Sequences = dict[tuple[int, str], list[tuple[str, str]]]  # (rank, group) -> [(op, site)] in order


def call_sequences(folder: Path) -> Sequences:
    """Each rank's calls per group in a finished run's traces (the fault-free run's: what the
    program does when nothing is late)."""
    from hctool.consensus.trace import TraceDirReader, TraceError

    out: Sequences = {}
    try:
        events = TraceDirReader(str(folder)).poll()
    except (OSError, TraceError):
        return out
    for ev in sorted(events, key=lambda e: e.get("t") or 0.0):
        if ev.get("op") is not None and ev.get("g") is not None and "dir" not in ev:  # the group's channel
            out.setdefault((int(ev["rank"]), str(ev["g"])), []).append((str(ev["op"]), str(ev.get("site"))))
    return out


def against_fault_free(report: Report, normal: Sequences) -> None:
    """Decide "extra on one rank" or "skipped on the other" from what the fault-free run did at
    that place. The traces of the failing run alone cannot always tell (the first call of a site
    that runs under a condition: either one rank made it or the other skipped it); the fault-free
    run can: where every rank of it made the cause's call at that position of the group, after
    the same run of calls, that call is the program's normal path and the ranks without it
    skipped it; where none made it, it is extra. Anything less certain leaves the report as is."""
    first = report.first_divergence
    cause = first.cause if first is not None else None
    if first is None or cause is None or first.kind not in (Kind.EXTRA, Kind.MISSING) or first.never_reached:
        return
    if " p2p " in (first.group or ""):
        return  # its seq counts a send/recv pair's channel, not the group's calls (align.route)
    group, seq, call = cause.call.group or first.group, cause.seq, (cause.call.op, cause.call.site)
    ranks = sorted(first.ranks)
    rows = [normal.get((r, group), []) for r in ranks]
    if len(ranks) < 2 or any(len(row) <= seq for row in rows):
        return
    after = cause.after or {}
    n = int(after.get("count") or 0)
    run_before = (after.get("op"), after.get("site"))
    if n and any(row[seq - k] != run_before for row in rows for k in range(1, min(n, seq) + 1)):
        return  # the fault-free run came to this position by another path: not comparable
    # the ranks that made the cause's call in the failing run: the extra call's culprits, or the
    # ranks other than those said to have skipped it
    makers = first.culprit_ranks if first.kind is Kind.EXTRA else [r for r in ranks if r not in first.culprit_ranks]
    at = {row[seq] for row in rows}
    if at == {call}:  # the normal path: whoever lacks it skipped it
        kind, culprits = Kind.MISSING, [r for r in ranks if r not in makers]
    elif call not in at and len(at) == 1:  # nobody makes it when nothing is late: it is extra
        kind, culprits = Kind.EXTRA, list(makers)
    else:
        return
    if not culprits or (kind, sorted(culprits)) == (first.kind, sorted(first.culprit_ranks)):
        return
    before = first.cause_line().removeprefix("cause: ")
    first.kind = cause.kind = kind
    first.culprit_ranks = cause.culprit_ranks = sorted(culprits)
    first.confidence = Confidence.HIGH
    first.basis = (
        f"in the fault-free run every rank made the {cause.call.op} at {cause.call.site} at this position"
        if kind is Kind.MISSING
        else f"in the fault-free run no rank made the {cause.call.op} at {cause.call.site} at this position"
    ) + f" of group {group} (call {seq + 1})"
    first.alternative = f"the traces of this run alone also read: {before}"


class ChaosSetupError(RuntimeError):
    """The program cannot be explored (it fails without faults); one line."""


@dataclass(frozen=True)
class CommandTarget:
    command: Command
    nproc: int
    hang_after: float
    timeout: float
    same_output: str | None
    args: tuple[str, ...]  # the CLI words that name this target again (for replay)

    scope: ClassVar[Scope] = Scope.ANY  # the generic kinds only: the engine's need hctool's engine
    default_horizon_s: ClassVar[float | None] = None  # the fault-free run's length
    checkers: ClassVar[tuple[str, ...]] = COMMAND_CHECKERS

    @property
    def label(self) -> str:
        return self.command.label

    @property
    def replay(self) -> str:
        return shlex.join(self.args)

    def runner(self, root: Path, history, starve_ticks: int = 0, horizon_s: float | None = None):
        return CommandRunner(self, root, history, horizon_s=horizon_s)

    def unresolved(self, f: Fault) -> str | None:
        """Why a by-name fault's function is not in the program's source (None: it is, or no fn=)."""
        from hctool.supervise.resolve import check_function

        return check_function(f.fn, self.command.main_source()) if f.fn else None


def command_target(
    words: list[str],
    nproc: int,
    hang_after: float,
    timeout: float | None,
    same_output: str | None,
    default_hang_after: float,
) -> CommandTarget:
    from hctool.supervise.targets import parse_target

    cmd = parse_target(words)
    if same_output is not None:
        re.compile(same_output)  # re.error is a usage error of the caller
    args: list[str] = []
    if cmd.script_mode and nproc != 2:
        args += ["--nproc", str(nproc)]
    if hang_after != default_hang_after:
        args += ["--hang-after", f"{hang_after:g}"]
    if timeout is not None:
        args += ["--timeout", f"{timeout:g}"]
    if same_output is not None:
        args += ["--same-output", same_output]
    return CommandTarget(cmd, nproc, hang_after, timeout or DEFAULT_TIMEOUT_S, same_output, (*args, "--", *cmd.words))


class CommandRunner:
    """The ChaosRunner of a command target: same interface (prepare, run, world_size, horizon_s)."""

    checkers = COMMAND_CHECKERS
    early_windows = False  # a program's interesting part can come late in its run

    def __init__(self, target: CommandTarget, artifacts: Path, history: History, horizon_s: float | None = None):
        self.target, self.root, self.history = target, Path(artifacts), history
        self.horizon_given = horizon_s
        self.horizon_s = horizon_s or 10.0
        self.world_size = target.command.world_size(target.nproc) or 2
        self.baseline: Counter | None = None
        self.prepared = False
        self.consensus_blind = False  # the fault-free run recorded no collective: nothing to compare
        self.activity: Activity | None = None  # the fault-free run's collectives: where faults are drawn
        self.normal: Sequences = {}  # the fault-free run's calls: what a divergence is compared with

    def prepare(self) -> None:
        """The fault-free run: it must be clean; its stdout lines and length are the reference."""
        if self.prepared:
            return
        t0, launched = time.monotonic(), time.time()
        report, codes = self._run_job("baseline", [], None)
        seconds = time.monotonic() - t0
        # A program that forms no process group (or calls no collective) can still be explored for
        # its exits and output; the consensus invariant is then blind, and says so on every run.
        self.consensus_blind = report.verdict in (Verdict.NO_PROCESS_GROUP, Verdict.NO_COLLECTIVES)
        if (report.verdict is not Verdict.CONSISTENT and not self.consensus_blind) or any(
            c not in (0, None) for c in codes.values()
        ):
            raise ChaosSetupError(
                f"the program fails without faults ({report.headline()}, exit codes {codes}); "
                f"see {self.root / 'baseline'}"
            )
        self.world_size = report.world_size or self.world_size
        if self.horizon_given is None:
            self.horizon_s = max(2.0, round(seconds, 1))
        self.baseline = self._output(self.root / "baseline")
        activity = activity_of(self.root / "baseline", launched)
        self.normal = call_sequences(self.root / "baseline")
        self.history.add(
            "baseline",
            seconds=round(seconds, 2),
            world_size=self.world_size,
            horizon_s=self.horizon_s,
            **({} if activity is None else {"activity": activity._asdict()}),
        )
        # faults are anchored to the program's calls, unless --horizon asked for seconds after launch
        self.activity = activity if self.horizon_given is None else None
        self.prepared = True

    def run(self, schedule: Schedule, name: str) -> RunResult:
        from hctool.supervise.faults import FaultController

        self.prepare()
        faults = schedule.healed(self.world_size)
        self.history.add("invoke", run=name, schedule=schedule.to_dict())
        t0 = time.monotonic()
        controller = FaultController(
            faults, self._dir(name) / "fault-clock", heal_s=schedule.heal_s, seed=schedule.seed, history=self.history
        )
        report, codes = self._run_job(name, faults, controller)
        if self.normal:
            against_fault_free(report, self.normal)
        anomalies, blind = self.check(report, codes, controller.killed, self._dir(name))
        verdict = "invalid" if anomalies else "unknown" if controller.killed else "valid"
        result = RunResult(
            name,
            verdict,
            anomalies,
            blind,
            round(time.monotonic() - t0, 2),
            str(self._dir(name)),
            fired_totals(report.faults),
        )
        for a in anomalies:
            self.history.add("anomaly", run=name, invariant=a.invariant, evidence=a.evidence)
        self.history.add(
            "verdict",
            run=name,
            verdict=verdict,
            consensus=report.verdict.value,
            exit_codes=codes,
            faults=report.faults,
            blind=blind,
            seconds=result.seconds,
        )
        return result

    def _dir(self, name: str) -> Path:
        return self.root / name

    def _run_job(self, name: str, faults, controller):
        from hctool.consensus.run import RunOptions, run_job

        folder = self._dir(name)
        (folder / "cwd").mkdir(parents=True, exist_ok=True)
        t = self.target
        # Each run in a fresh working directory: a checkpoint one run writes (./snapshot.pt)
        # must not change what the next run does. File arguments are made absolute and the
        # caller's folder is on the ranks' PYTHONPATH (run_job), so `python -m pkg` still imports.
        report, _ = run_job(
            RunOptions(
                command=list(t.command.anchored().words),
                nproc=t.nproc,
                timeout=t.timeout,
                hang_after=t.hang_after,
                abort=True,
                trace_dir=folder,
                script_mode=t.command.script_mode,
                faults=tuple(faults),
                controller=controller,
                split_stdout=t.same_output is not None,
                cwd=folder / "cwd",
            )
        )
        codes = {int(r): c for r, c in (report.exit_codes or {}).items()}
        if report.command_exit_code not in (None, 0):
            codes.setdefault(-1, report.command_exit_code)  # the command itself failed
        return report, codes

    def check(self, report: Report, codes: dict[int, int | None], killed: list[int], folder: Path):
        found, blind = [], []
        verdict = report.verdict.value
        if self.consensus_blind:
            blind.append("consensus")
        if report.verdict is Verdict.DIVERGED:
            found.append(Anomaly("consensus", consensus_evidence(report)))
        if report.verdict is Verdict.HUNG and not killed:
            found.append(
                Anomaly(
                    "liveness",
                    dict(
                        consensus_evidence(report),
                        what="a collective blocked while a peer was elsewhere, or the job did not end in time",
                    ),
                )
            )
        failed = {r: c for r, c in codes.items() if r not in killed and c not in (0, None)}
        if failed and not killed and verdict != "diverged":
            found.append(
                Anomaly("exits", {"exit_codes": {str(r): c for r, c in sorted(failed.items())}, "verdict": verdict})
            )
        if self.target.same_output is not None:
            unseen_as_baseline = (
                self.consensus_blind and not report.verdict.seen and report.verdict is not Verdict.INCOMPLETE
            )
            if killed or (verdict != "consistent" and not unseen_as_baseline):
                blind.append("output")
            else:
                got = self._output(folder)
                if got != self.baseline:
                    missing, extra = self.baseline - got, got - self.baseline
                    found.append(
                        Anomaly(
                            "output",
                            {
                                "regex": self.target.same_output,
                                "missing": sorted(missing.elements())[:10],
                                "unexpected": sorted(extra.elements())[:10],
                            },
                        )
                    )
        return found, blind

    def _output(self, folder: Path) -> Counter:
        """The stdout lines matching --same-output (every rank's, as a multiset)."""
        if self.target.same_output is None:
            return Counter()
        pattern = re.compile(self.target.same_output)
        files = [folder / "stdout.log"] if not self.target.command.script_mode else sorted(folder.glob("rank*.stdout"))
        lines: Counter = Counter()
        for f in files:
            if f.is_file():
                lines.update(ln for ln in f.read_text(errors="replace").splitlines() if pattern.search(ln))
        return lines
