"""Run one chaos schedule against a target with the repro harness.

The harness starts the engine, drives the workload and watches it; the
`Controller` (hctool/chaos/controller.py, its hooks) applies the schedule, and
after teardown the invariant checkers look at what the processes left behind."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from hctool.chaos import cache
from hctool.chaos.controller import Controller
from hctool.chaos.history import History
from hctool.chaos.invariants import CHECKERS, Anomaly, RunRecord, check_all
from hctool.chaos.schedule import Schedule
from hctool.launch import TopologyError
from hctool.protocol.faults import IN_RANK
from hctool.repro.harness import HarnessOptions, ReproHarness

if TYPE_CHECKING:  # the target makes its runner (target.runner()): only a type here
    from hctool.chaos.target import Target


DEFAULT_HORIZON_S = 20.0  # where the reference's length is not known (a cache entry older than it)


class RunResult(NamedTuple):
    name: str
    verdict: str  # valid | invalid | unknown
    anomalies: list[Anomaly]
    blind: list[str]  # checkers that could not look
    seconds: float
    run_dir: str
    fired: dict[str, int] | None = None  # fault spec -> times it acted in this run (None: not counted)


def fired_totals(faults: list[dict] | None) -> dict[str, int] | None:
    """A run report's per-fault counts ({"spec", "total", ...}) as spec -> total."""
    if not faults:
        return None
    return {str(f["spec"]): int(f.get("total") or 0) for f in faults if isinstance(f, dict) and "spec" in f}


class ChaosRunner:
    def __init__(
        self,
        target: Target,
        artifacts: Path,
        history: History,
        starve_ticks: int = 1000,
        checkers: tuple[str, ...] = CHECKERS,
        timeout: float | None = None,
        horizon_s: float | None = None,
    ):
        self.target, self.history, self.checkers = target, history, checkers
        self.horizon_given = horizon_s
        self.horizon_s = horizon_s or DEFAULT_HORIZON_S  # measured in prepare() unless given
        self.starve_ticks = starve_ticks
        self.harness = ReproHarness(target.scenario, HarnessOptions(artifacts=artifacts, timeout=timeout))
        self.prepared = False

    early_windows = True  # the engine: fault windows open early, while requests queue
    activity = None  # windows follow the horizon, not a measured run (schedule.generate)

    @property
    def world_size(self) -> int:
        return self.harness.world_size  # every rank a schedule may target: dp x pp x tp

    def prepare(self) -> None:
        if self.prepared:
            return
        if cache.load(self.harness):
            self.history.add("prepare-cached", storage_seed=str(self.harness.storage_seed))
        else:
            self.harness.prepare()
            cache.save(self.harness)
        # Faults start while the workload runs: within the no-cache reference's length (22607's
        # workload is done in ~3 s; a fixed 20 s horizon put most windows after it)
        if self.horizon_given is None and self.harness.reference_s:
            self.horizon_s = max(2.0, round(self.harness.reference_s, 1))
            self.history.add("horizon", seconds=self.horizon_s, source="the no-cache reference's workload")
        self.prepared = True

    def run(self, schedule: Schedule, name: str, attempt: int = 1) -> RunResult:
        self.prepare()
        faults = schedule.healed(self.world_size)
        prompts = [((r, i), p) for r, ps in enumerate(self.harness.rounds) for i, p in enumerate(ps)]
        ctl = Controller(schedule, faults, prompts, self.history, self.starve_ticks)
        ctl.max_new_tokens = self.target.scenario.workload.max_new_tokens
        # the controller carries out the schedule's other kinds; the ranks ignore them
        in_rank = [*self.target.base_faults, *(f for f in faults if f.kind in IN_RANK)]
        self.history.add("invoke", run=name, schedule=schedule.to_dict())
        t0 = time.monotonic()
        try:
            report = self.harness.run_variant(self.target.variant, faults=in_rank, hooks=ctl, name=name)
        except TopologyError as exc:  # the engine never came up (e.g. a port taken meanwhile)
            ctl.release()
            self.history.add("verdict", run=name, verdict="unknown", reason=f"engine did not start: {exc}")
            if attempt == 1:  # once more, under a new name: startup is not what chaos tests
                return self.run(schedule, f"{name}-again", attempt=2)
            return RunResult(name, "unknown", [], list(self.checkers), round(time.monotonic() - t0, 2), name)
        finally:
            ctl.release()
        rec = self._record(ctl, Path(report.artifacts))
        anomalies, blind = check_all(rec, self.checkers) if rec else ([], list(self.checkers))
        verdict = "invalid" if anomalies else "unknown" if (ctl.killed or rec is None) else "valid"
        seconds, fired = round(time.monotonic() - t0, 2), fired_totals(report.faults)
        result = RunResult(name, verdict, anomalies, blind, seconds, report.artifacts, fired)
        for a in anomalies:
            self.history.add("anomaly", run=name, invariant=a.invariant, evidence=a.evidence)
        self.history.add(
            "verdict",
            run=name,
            verdict=verdict,
            harness=report.verdict,
            reason=report.reason,
            requests=report.requests,
            faults=report.faults,
            blind=blind,
            seconds=result.seconds,
        )
        return result

    def _record(self, ctl: Controller, run_dir: Path) -> RunRecord | None:
        if not ctl.record:
            return None
        obs, driver = ctl.record["obs"], ctl.record["driver"]
        ref = self.harness.reference or {}
        answered = {
            **{("workload", f"{k[0]}.{k[1]}"): v for k, v in driver.outputs.items()},
            **{(t[0], str(t[1])): v for t, v in ctl.extra.items()},
        }
        expected = {
            **{("workload", f"{k[0]}.{k[1]}"): v for k, v in ref.items()},
            **{(t[0], str(t[1])): ref.get(k) for t, k in ctl.extra_expected.items()},
        }
        meta = {
            **{("workload", f"{k[0]}.{k[1]}"): v for k, v in driver.meta.items()},
            **{(t[0], str(t[1])): v for t, v in ctl.extra_meta.items()},
        }
        unanswered = (
            max(0, driver.sent - driver.succeeded - driver.failed)
            + ctl.extra_failed
            + sum(t.is_alive() for t in ctl.threads)
        )
        return RunRecord(
            run_dir,
            obs.outcome,
            obs.rank_died,
            obs.watcher_report,
            obs.final_report,
            driver.sent,
            answered,
            meta,
            expected,
            list(driver.errors),
            unanswered,
            list(ctl.killed),
            ctl.cancelled,
            ctl.metrics_text,
            ctl.record["orphans"],
        )
