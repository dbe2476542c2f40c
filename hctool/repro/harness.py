"""Run the variants of one scenario end to end and derive each verdict.

Per invocation: a setup run writes the cold prefixes to storage (once), and a
no-cache reference run answers every prompt (once). Per variant run: a copy of
that storage, the topology with the recorder and the scenario's faults, the
workload over HTTP, a live consensus check, stall detection; on trouble, stacks
of every rank; then teardown, trace analysis and the verdict."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import requests

from engine.lab import ServerArgs, Variants
from hctool.consensus import analyze_dir
from hctool.consensus.live import LiveWatcher, merge_live
from hctool.console import log as hlog
from hctool.console import progress
from hctool.launch import PDTopology, Topology
from hctool.protocol import faultcounts
from hctool.protocol.faults import IN_RANK, Fault
from hctool.repro.scenario import Scenario, Variant
from hctool.repro.state import find_state_divergence
from hctool.repro.verdict import Observation, VariantReport, judge
from hctool.repro.workload import WorkloadDriver, build_prompts, run_to_completion
from hctool.supervise.faults import FaultController
from hctool.supervise.procs import alive as _alive
from hctool.supervise.stacks import dump_stacks
from hctool.supervise.watch import watch

DEATH_GRACE_S = 5.0  # a rank whose socket closed has this long to exit


def log(msg: str) -> None:
    hlog.info(msg)


@dataclasses.dataclass
class HarnessOptions:
    artifacts: Path
    tp: int | None = None
    runs: int = 1
    timeout: float | None = None  # overrides the scenario's per-variant deadline
    startup_timeout: float = 300.0
    device: str = "cpu"  # cuda: the model and pools on GPUs (hctool repro --cuda)


class ReproHarness:
    def __init__(self, scenario: Scenario, opts: HarnessOptions):
        self.s, self.opts = scenario, opts
        self.tp = opts.tp or scenario.tp
        # the ranks of one (decode) server: dp replicas x pp stages x tp ranks, what the checks watch
        self.world_size = scenario.server_args(scenario.variants[0], self.tp).world_size
        self.root = Path(opts.artifacts)
        self.root.mkdir(parents=True, exist_ok=True)
        vocab = ServerArgs().model.vocab_size
        self.rounds, self.cold = build_prompts(scenario.workload, vocab)
        self.storage_seed: Path | None = None
        self.device_flags: tuple[str, ...] = () if opts.device == "cpu" else ("--device", opts.device)
        self.reference: dict | None = None
        self.reference_s: float | None = None  # seconds the reference took to answer the workload

    # -- once per invocation ------------------------------------------------------------
    def prepare(self) -> None:
        if self.s.path is not None:
            shutil.copy(self.s.path, self.root / "scenario.toml")
        first = self.s.server_args(self.s.variants[0], self.tp, self.device_flags)
        if first.hicache_storage_backend and self.cold:
            self.storage_seed = self.root / "storage-seed"
            args = self.s.server_args(
                self.s.variants[0],
                self.tp,
                (*self.device_flags, *self.s.setup_flags, "--hicache-storage-dir", str(self.storage_seed)),
            )
            log(f"setup: writing {len(self.cold)} cold prefixes to storage ({self.storage_seed})")
            with Topology(args, self.root / "setup", inherit_probes=False) as topo:  # as the reference: plain
                url = topo.start(self.opts.startup_timeout)
                run_to_completion(url, [[c + [1] for c in self.cold]], 1, self.s.deadline)
                requests.post(f"{url}/flush_cache", timeout=self.s.deadline).raise_for_status()  # waits for backups
                topo.shutdown()
        ref_args = dataclasses.replace(
            first,
            enable_hierarchical_cache=False,
            hicache_storage_backend=None,
            disable_radix_cache=True,
            run_dir="",
            variants=Variants(),
            state_digest=False,
            req_waiting_timeout=0.0,
            max_total_tokens=max(first.max_total_tokens, 16384),
        )
        log("reference: answering every prompt without any cache")
        # The reference is the plain engine: probes set in the environment (a test's breaking
        # probe, a user's own) shape the runs under test, not what they are compared with.
        with Topology(ref_args, self.root / "reference", inherit_probes=False) as topo:
            url = topo.start(self.opts.startup_timeout)
            t0 = time.monotonic()
            self.reference = run_to_completion(url, self.rounds, self.s.workload.max_new_tokens, self.s.deadline * 2)
            self.reference_s = round(time.monotonic() - t0, 2)  # the workload's length: chaos's horizon
            topo.shutdown()

    # -- one variant run -------------------------------------------------------------------
    def run_variant(
        self, variant: Variant, index: int = 0, faults: list[Fault] | None = None, hooks=None, name: str | None = None
    ) -> VariantReport:
        """One run. `faults` replaces the scenario's; `hooks` (chaos) is told when the
        workload starts (`started(topo, url, driver, t0)`), may act while it runs
        (`tick()`), sees the engine at quiesce before teardown (`quiesce(topo, url,
        driver)`) and gets the observation (`finished(obs, driver, topo)`). Without hooks, the
        faults that act outside the ranks (a scenario's rank-pause) go to a FaultController;
        then, and only then, the ranks' fault clock starts with the workload (else at launch)."""
        name = name or (variant.name if self.opts.runs == 1 else f"{variant.name}-run{index + 1}")
        faults = list(self.s.faults) if faults is None else list(faults)
        vdir = self.root / name
        traces = vdir / "traces"
        extra: tuple[str, ...] = ()
        if self.storage_seed is not None:
            shutil.copytree(self.storage_seed, vdir / "storage")
            extra = ("--hicache-storage-dir", str(vdir / "storage"))
        args = self.s.server_args(variant, self.tp, (*self.device_flags, *extra))
        deadline_s = self.opts.timeout or self.s.deadline
        shape = (
            f"PD prefill TP={self.s.prefill_tp} + decode TP={self.tp}"
            if self.s.pd
            else f"TP={args.tp_size}"
            + (f" PP={args.pp_size}" if args.pp_size > 1 else "")
            + (f" DP={args.dp_size}" if args.dp_size > 1 else "")
        )
        log(f"{name}: starting {shape} with faults {', '.join(f.spec() for f in faults) or 'none'}")
        t0 = time.monotonic()
        stacks: dict[str, str] = {}
        outside = [f for f in faults if f.kind not in IN_RANK]
        fc = FaultController(outside, vdir / "fault-clock") if outside and hooks is None else None
        env = {"HCTOOL_TRACE_DIR": str(traces), **(hooks.env(vdir) if hooks else fc.env() if fc else {})}
        probes = [*self.s.probes, *(hooks.probes if hooks else ())]
        if self.s.pd:  # the decode side is traced and watched (the prefill's traces sit beside)
            topo = PDTopology(
                args,
                self.s.prefill_tp,
                self.tp,
                vdir,
                faults=faults,
                probes=probes,
                side_env={"decode": env, "prefill": {"HCTOOL_TRACE_DIR": str(vdir / "traces-prefill")}},
            )
        else:
            topo = Topology(args, vdir, faults=faults, probes=probes, extra_env=env)
        load_back: list[int] = []
        with topo:
            url = topo.start(self.opts.startup_timeout)
            (vdir / "commands.txt").write_text(_commands(topo, args, self.s, faults))
            watcher = LiveWatcher(traces, args.world_size, hang_after=self.s.hang_after)
            driver = WorkloadDriver(
                url,
                self.rounds,
                self.s.workload.max_new_tokens,
                deadline_s,
                on_round_end=lambda r: load_back.append(_load_back_tokens(url)),
            )
            if hooks:
                hooks.started(topo, url, driver, time.time())
            elif fc:
                fc.started()
            driver.start()
            started = time.monotonic()
            with progress.task(name, total=sum(map(len, self.rounds)), text="requests answered") as bar:
                try:
                    outcome, live, death = self._watch(topo, watcher, driver, started, deadline_s, hooks, bar, fc)
                finally:
                    if fc:
                        fc.release()  # never leave a stopped rank behind
            if outcome == "done" and hooks:
                hooks.quiesce(topo, url, driver)
            if outcome != "done":
                alive = {r: pid for r, pid in topo.pids_by_rank().items() if _alive(pid)}
                stacks = dump_stacks(alive, timeout=10.0, trace_dir=str(traces)) if alive else {}
            if outcome == "done":
                codes = topo.shutdown()
            else:
                driver.stop()
                codes = topo.rank_exit_codes()
            # what ranks still running write from here on is the teardown's doing, not the run's
            ended_at = None if outcome == "done" else time.monotonic()
        final = analyze_dir(traces, exit_codes=codes, stacks=stacks, ended_at=ended_at)
        # how often each fault fired: the ranks' own counts (both sides of a PD run), the supervisor's
        folders = [traces, vdir / "traces-prefill"] if self.s.pd else [traces]
        fired = faultcounts.read(folders, [f.spec() for f in faults if f.kind in IN_RANK])
        fired += hooks.counts() if hooks else fc.counts() if fc else []
        for row in fired:
            log(f"{name}: fault {faultcounts.describe(row)}")
        differing = self._outputs_differing(driver)
        obs = Observation(
            outcome, death, live, final, driver.sent, driver.succeeded, not differing, driver.aborted, differing
        )
        if hooks:
            hooks.finished(obs, driver, topo, codes)
        per_round = [b - a for a, b in zip([0, *load_back], load_back)]
        # the one rule of every road (consensus/live.merge_live): the final analysis, except what
        # ending the job took away from it
        first = merge_live(final, live, stacks).first_divergence
        state = find_state_divergence(vdir / "state")  # written by ranks run with --state-digest
        j = judge(obs, variant.expected, per_round, self.s.require_load_back, variant.mechanism, first, state)
        report = VariantReport(
            variant.name,
            list(variant.expected),
            j.verdict,
            j.ok,
            round(time.monotonic() - t0, 2),
            per_round,
            driver.counts(),
            j.reason,
            j.mechanism,
            state,
            first,
            stacks or final.stacks or {},
            str(vdir),
            # calls per rank per op, from the analysis of every trace after teardown
            counts=final.counts or (live.counts if live is not None else {}),
            faults=fired,
        )
        (vdir / "report.json").write_text(json.dumps(report.to_json(), indent=2))
        if stacks:
            (vdir / "stacks.txt").write_text("".join(f"== rank {r} ==\n{t}\n" for r, t in sorted(stacks.items())))
        log(f"{name}: {j.verdict} ({j.reason}) in {report.seconds} s")
        return report

    def _watch(
        self,
        topo: Topology | PDTopology,
        watcher: LiveWatcher,
        driver: WorkloadDriver,
        started: float,
        deadline_s: float,
        hooks=None,
        bar=None,
        fc: FaultController | None = None,
    ):
        """The supervisor's watch loop over the topology: (outcome, live report, death message)."""
        total = sum(map(len, self.rounds))

        def tick() -> None:
            if bar is not None:  # a terminal's progress line: requests answered of the workload's
                answered = driver.succeeded + driver.failed
                bar.update(completed=answered, text=f"{answered}/{total} requests answered")
            if hooks:
                hooks.tick()

        def done() -> bool:
            if not (driver.done.is_set() and (hooks.idle() if hooks else fc.idle() if fc else True)):
                return False
            # Requests failed: the frontend fails them as soon as a rank's socket closes,
            # which can be before that rank's process has exited; wait for its death.
            return not (driver.succeeded + driver.aborted < driver.sent and topo.wait_for_death(DEATH_GRACE_S))

        watched = watch(
            topo,
            watcher,
            deadline=started + deadline_s,
            done=done,
            faults=fc,
            on_tick=tick,
            death_grace_s=0.5,  # the checker reads the last records of the dying rank
            codes_to_watcher=False,
            last_progress=lambda: max(driver.last_progress, started, hooks.last_progress if hooks else 0.0),
            stall_s=self.s.stall_timeout,
        )
        outcome = "watcher" if watched.outcome == "finding" else watched.outcome
        return outcome, watched.finding, watched.death.message() if watched.death is not None else None

    def _outputs_differing(self, driver: WorkloadDriver) -> int:
        ref = self.reference or {}
        return sum(ref.get(k) != v for k, v in driver.outputs.items())

    def run(self, variants: list[Variant]) -> dict:
        self.prepare()
        results = []
        for v in variants:
            runs = [self.run_variant(v, k) for k in range(self.opts.runs)]
            results.append((VariantReport.summarize(runs) if len(runs) > 1 else runs[0]).to_json())
        out = {"id": self.s.id, "title": self.s.title, "variants": results, "artifacts": str(self.root)}
        (self.root / "report.json").write_text(json.dumps(out, indent=2))
        return out


def _load_back_tokens(url: str) -> int:
    """hicache_load_back_tokens_total from /metrics (the router's is the decode's); -1 if unreadable."""
    try:
        text = requests.get(f"{url}/metrics", timeout=10).text
    except requests.RequestException:
        return -1
    for line in text.splitlines():
        if line.startswith("hicache_load_back_tokens_total "):
            return int(float(line.split()[1]))
    return -1


def _commands(topo: Topology, args: ServerArgs, s: Scenario, faults: list[Fault]) -> str:
    specs = ", ".join(f.spec() for f in faults) or "none"
    lines = [
        f"# scenario {s.id}; faults: {specs}; probes: {', '.join(s.probes) or 'none'}",
        f"# engine args: {args.to_json()}",
    ]
    lines += [f"{c.name}: pid {c.popen.pid}: {' '.join(c.popen.args)}" for c in topo.procs.children]
    return "\n".join(lines) + "\n"
