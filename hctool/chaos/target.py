"""What a chaos run runs: a repro scenario's engine configuration and workload
(`--scenario ID --variant V [--no-scenario-faults]`), or a plain `hctool
launch` flag set (after `--`) with a default workload."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from hctool.protocol.faults import Fault, Scope
from hctool.repro.scenario import Scenario, ScenarioError, Variant, Workload


@dataclass(frozen=True)
class Target:
    scenario: Scenario
    variant: Variant
    base_faults: tuple[Fault, ...]  # the scenario's own faults, unless --no-scenario-faults
    args: tuple[str, ...]  # the CLI words that name this target again (for replay)

    # What chaos does differs by target in these members only (the command target has them too):
    # chosen once, where the target is made, not asked again with isinstance.
    scope: ClassVar[Scope] = Scope.ENGINE  # the fault kinds that can act on it, and those drawn
    default_horizon_s: ClassVar[float | None] = None  # the no-cache reference's workload length

    @property
    def label(self) -> str:
        return " ".join(self.args)

    replay = label  # the same words name the target in a replay command

    @property
    def checkers(self) -> tuple[str, ...]:
        from hctool.chaos.invariants import CHECKERS

        return CHECKERS

    def runner(self, root: Path, history, starve_ticks: int, horizon_s: float | None = None):
        from hctool.chaos.runner import ChaosRunner

        extra = {} if horizon_s is None else {"horizon_s": horizon_s}
        return ChaosRunner(self, root, history, starve_ticks, **extra)

    def unresolved(self, f: Fault) -> str | None:
        """Why a by-name fault's function is not in the target (the engine's are checked at run time)."""
        return None


# A collective blocked this long while a peer is elsewhere is a hang. A repro scenario's own
# bound is tuned to call its bug fast (30760: 3 s); under a chaos schedule a rank may be slow
# by what the schedule injects (free delays add up: a 4 s wait behind ~1 s of delayed frees,
# then healthy, docs/chaos.md), so chaos holds a hang to a bound above that.
CHAOS_HANG_AFTER_S = 10.0


def scenario_target(
    sid: str,
    variant: str | None,
    no_scenario_faults: bool,
    catalogue: list[Path] = (),
    rounds: int | None = None,
    hang_after: float | None = None,
) -> Target:
    """`rounds` caps the scenario's workload: a chaos run needs rounds enough for the
    faults to meet queued work, not the repro's full length (the runs per minute
    are what finds a timing bug). `hang_after` replaces the scenario's hang bound."""
    from hctool.repro.catalogue import find_scenario

    s = find_scenario(sid, list(catalogue))
    v = s.variant(variant) if variant else s.variants[0]
    args = ["--scenario", sid, "--variant", v.name, *(["--no-scenario-faults"] if no_scenario_faults else [])]
    if rounds is not None and rounds < s.workload.rounds:
        s = replace(s, workload=replace(s.workload, rounds=rounds))
        args += ["--rounds", str(rounds)]
    if hang_after is not None:
        s = replace(s, hang_after=hang_after)
        if hang_after != CHAOS_HANG_AFTER_S:  # a replay runs with chaos's default
            args += ["--hang-after", f"{hang_after:g}"]
    for c in catalogue:
        args += ["--catalogue", str(c)]
    return Target(s, v, () if no_scenario_faults else s.faults, tuple(args))


def launch_target(flags: list[str], tp: int = 2, hang_after: float | None = None) -> Target:
    """`-- --tp 2 --enable-hierarchical-cache ...`: the engine flags of `hctool launch`
    (--tp included), with a default workload of hot prefixes over a small pool."""
    flags = list(flags)
    if "--tp" in flags:
        i = flags.index("--tp")
        try:
            tp = int(flags[i + 1])
        except (IndexError, ValueError):
            raise ScenarioError("--tp needs an integer") from None
        del flags[i : i + 2]
    s = Scenario(
        id="launch",
        title="hctool launch " + shlex.join(flags),
        summary="",
        upstream={},
        tp=tp,
        engine_flags=tuple(flags),
        setup_flags=(),
        faults=(),
        probes=(),
        workload=Workload(
            seed=0,
            hot_prefixes=4,
            prefix_tokens=128,
            suffix_tokens=16,
            requests_per_round=8,
            rounds=3,
            max_new_tokens=8,
        ),
        variants=(Variant("launch", (), ("healthy",)),),
        stall_timeout=20.0,
        deadline=120.0,
        hang_after=CHAOS_HANG_AFTER_S if hang_after is None else hang_after,
    )
    try:
        s.server_args(s.variants[0])
    except ValueError as exc:
        raise ScenarioError(f"engine flags: {exc}") from None
    hang = ("--hang-after", f"{s.hang_after:g}") if s.hang_after != CHAOS_HANG_AFTER_S else ()
    return Target(s, s.variants[0], (), (*hang, "--", "--tp", str(tp), *flags))
