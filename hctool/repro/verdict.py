"""Verdicts are derived from what the processes did, never declared by a scenario."""

from __future__ import annotations

from dataclasses import dataclass, field

from hctool.consensus.model import Divergence, Report, Verdict


@dataclass
class Observation:
    """What the harness saw while a variant ran, before it tore the topology down."""

    outcome: str  # done | stalled | deadline | watcher | death
    rank_died: str | None  # "rank 1 died (killed by SIGABRT)..." if a rank exited on its own
    watcher_report: Report | None  # the live checker's report, if it fired
    final_report: Report | None  # check-consensus analysis of the traces after teardown
    sent: int
    succeeded: int
    outputs_match: bool  # every answered request equals the no-cache reference
    aborted: int = 0  # dropped by the server's own --req-waiting-timeout (HTTP 408)
    outputs_differing: int = 0  # how many answers differ from the reference (when known)


def _blocked(report: Report | None) -> bool:
    fd = report.first_divergence if report is not None else None
    return fd is not None and any(r.state == "blocked" for r in fd.ranks.values())


def derive_verdict(obs: Observation) -> tuple[str, str]:
    """(verdict, reason).
    crashed: a rank died on its own (e.g. gloo's size-mismatch abort).
    deadlocked: ranks alive, but the workload stopped moving, or the live checker
      caught ranks blocked in mismatched collectives.
    diverged: a divergence was found (live or in the traces) or outputs differ from
      the reference, while the job kept going or ended.
    healthy: every request answered (or dropped by the server's waiting timeout),
      answers equal the reference, traces consistent."""
    if obs.rank_died:
        return "crashed", obs.rank_died
    if obs.outcome in ("stalled", "deadline"):
        return "deadlocked", f"no request answered for a while ({obs.succeeded}/{obs.sent} answered); ranks alive"
    if obs.outcome == "watcher" and (_blocked(obs.watcher_report) or obs.watcher_report.verdict is Verdict.HUNG):
        return "deadlocked", "ranks blocked in mismatched collectives (live check)"
    final = obs.final_report.verdict.value if obs.final_report is not None else None
    if obs.outcome == "watcher" or final in ("diverged", "hung"):
        return "diverged", "the consensus check found a divergence while the job kept going"
    if obs.succeeded + obs.aborted < obs.sent:  # a timeout abort is an answer the server chose
        return "diverged", f"only {obs.succeeded}/{obs.sent} requests answered ({obs.aborted} aborted by timeout)"
    if not obs.outputs_match:
        n = f"{obs.outputs_differing} of {obs.succeeded} answers" if obs.outputs_differing else "outputs"
        return "diverged", f"{n} differ from the no-cache reference"
    if final not in (None, "consistent") and obs.final_report is not None and obs.final_report.verdict.seen:
        return "diverged", f"trace analysis says {final}"
    return "healthy", "every request answered, outputs equal the reference, traces consistent"


@dataclass
class Judgement:
    """The verdict of one variant run and whether it is the one the scenario expects."""

    verdict: str
    ok: bool
    reason: str
    mechanism: dict | None = None  # {"declared", "seen", "evidence"} when the variant declares one


def judge(
    obs: Observation,
    expected: tuple[str, ...],
    load_back_by_round: list[int],
    require_load_back: bool,
    mechanism=None,
    first_divergence: Divergence | None = None,
    state: dict | None = None,
) -> Judgement:
    """The one place a variant's outcome is decided: the verdict from what the processes did,
    `ok` when it is an expected one, a healthy run that never loaded back when the scenario
    needs load-backs is not ok, and a declared mechanism must be seen in the evidence (a
    buggy variant's `ok` means THIS bug, not any failure)."""
    from hctool.repro.mechanism import check_mechanism

    verdict, reason = derive_verdict(obs)
    ok = verdict in expected
    if ok and verdict == "healthy" and require_load_back and not all(x > 0 for x in load_back_by_round[1:]):
        ok, reason = (
            False,
            f"{reason}; but decode L2 load-backs per round were {load_back_by_round} (want > 0 after round 1)",
        )
    seen_mechanism = None
    if mechanism is not None:
        seen, evidence = check_mechanism(mechanism, first_divergence, state, obs.outputs_match)
        after = obs.final_report.first_divergence if obs.final_report is not None else None
        if not seen and after and after != first_divergence:
            # The live check reports the first mismatch it sees, which can be a consequence in
            # another group; the post-run analysis of every trace is the other finding.
            seen, more = check_mechanism(mechanism, after, state, obs.outputs_match)
            evidence += [f"post-run trace analysis: {e}" for e in more]
        seen_mechanism = {"declared": mechanism.describe(), "seen": seen, "evidence": evidence}
        if ok and not seen:
            reason += "; but not by the declared mechanism"
        ok = ok and seen
    return Judgement(verdict, ok, reason, seen_mechanism)


@dataclass
class VariantReport:
    """One variant run (or K runs, summarized): the JSON of `hctool repro --json` is to_json()."""

    name: str
    expected: list[str]
    verdict: str
    ok: bool
    seconds: float
    load_back_tokens_by_round: list[int]
    requests: dict
    reason: str
    mechanism: dict | None
    state_divergence: dict | None
    first_divergence: Divergence | None
    stacks: dict
    artifacts: str
    counts: dict = field(default_factory=dict)  # calls per rank per op (what --json's analysis saw)
    faults: list = field(default_factory=list)  # per fault: {"spec", "fired": {rank: n}, "total"}
    runs: int | None = None  # --runs K: K, with every run's verdict
    ok_runs: int | None = None
    verdicts: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        out = {
            k: getattr(self, k)
            for k in (
                "name",
                "expected",
                "verdict",
                "ok",
                "seconds",
                "load_back_tokens_by_round",
                "requests",
                "reason",
                "mechanism",
                "state_divergence",
                "first_divergence",
                "stacks",
                "counts",
                "faults",
                "artifacts",
            )
        }
        if self.first_divergence is not None:
            out["first_divergence"] = self.first_divergence.to_json()
        if self.runs is not None:
            out.update(runs=self.runs, ok_runs=self.ok_runs, verdicts=list(self.verdicts))
        return out

    @classmethod
    def summarize(cls, runs: list[VariantReport]) -> VariantReport:
        """--runs K: the last run's details, with every run's verdict and the count that came
        out as expected; ok only if all did."""
        from dataclasses import replace

        verdicts = [r.verdict for r in runs]
        last = runs[-1]
        mechanism = last.mechanism
        if mechanism is not None:
            mechanism = dict(mechanism, seen_runs=sum(bool((r.mechanism or {}).get("seen")) for r in runs))
        return replace(
            last,
            verdict=max(set(verdicts), key=verdicts.count),
            runs=len(runs),
            ok_runs=sum(r.ok for r in runs),
            verdicts=verdicts,
            seconds=round(sum(r.seconds for r in runs), 2),
            ok=all(r.ok for r in runs),
            mechanism=mechanism,
        )
