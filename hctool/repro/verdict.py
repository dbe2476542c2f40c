"""Verdicts are derived from what the processes did, never declared by a scenario."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Observation:
    """What the harness saw while a variant ran, before it tore the topology down."""

    outcome: str                 # done | stalled | deadline | watcher | death
    rank_died: str | None        # "rank 1 died (killed by SIGABRT)..." if a rank exited on its own
    watcher_report: dict | None  # the live checker's report, if it fired
    final_report: dict | None    # check-consensus analysis of the traces after teardown
    sent: int
    succeeded: int
    outputs_match: bool          # every answered request equals the no-cache reference
    aborted: int = 0             # dropped by the server's own --req-waiting-timeout (HTTP 408)
    outputs_differing: int = 0   # how many answers differ from the reference (when known)


def _blocked(report: dict | None) -> bool:
    fd = (report or {}).get("first_divergence") or {}
    return any(r.get("state") == "blocked" for r in fd.get("ranks", {}).values())


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
    if obs.outcome == "watcher" and (_blocked(obs.watcher_report) or obs.watcher_report.get("verdict") == "hung"):
        return "deadlocked", "ranks blocked in mismatched collectives (live check)"
    final = (obs.final_report or {}).get("verdict")
    if obs.outcome == "watcher" or final in ("diverged", "hung"):
        return "diverged", "the consensus check found a divergence while the job kept going"
    if obs.succeeded + obs.aborted < obs.sent:  # a timeout abort is an answer the server chose
        return "diverged", f"only {obs.succeeded}/{obs.sent} requests answered ({obs.aborted} aborted by timeout)"
    if not obs.outputs_match:
        n = f"{obs.outputs_differing} of {obs.succeeded} answers" if obs.outputs_differing else "outputs"
        return "diverged", f"{n} differ from the no-cache reference"
    if final not in (None, "consistent"):
        return "diverged", f"trace analysis says {final}"
    return "healthy", "every request answered, outputs equal the reference, traces consistent"
