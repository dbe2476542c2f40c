"""The harness hooks of one chaos run on the engine: the schedule goes to the supervisor's
FaultController (the fault clock, pauses and kills, every fault on and off in the history, the
heal); the workload kinds (bursts, cancellations) and two requests after the heal are sent
here; before teardown they wait for quiesce and read /metrics."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import requests

from hctool.chaos.history import History
from hctool.chaos.schedule import Schedule
from hctool.protocol.faults import Fault
from hctool.supervise.faults import FaultController
from hctool.supervise.procs import alive as _alive

QUIESCE_S = 3.0  # the chaos observer rewrites its record every 0.25 s while a rank is idle


class Controller:
    """The harness hooks of one chaos run: the schedule's faults go through the supervisor's
    FaultController (the clock, the history, pauses and kills); the workload kinds and the
    post-heal requests are this engine workload's."""

    probes = ("hctool.agent.chaos_observer",)

    def __init__(
        self, schedule: Schedule, faults: list[Fault], prompts: list[tuple], history: History, starve_ticks: int
    ):
        self.schedule, self.faults, self.history = schedule, faults, history
        self.prompts, self.starve_ticks = prompts, starve_ticks
        self.extra: dict = {}  # ("burst", i) -> output ids
        self.extra_meta: dict = {}
        self.extra_expected: dict = {}
        self.cancelled = self.extra_failed = 0
        self.threads: list[threading.Thread] = []
        self.metrics_text: str | None = None
        self.last_progress = 0.0  # monotonic: the harness's stall clock also counts waiting for the heal
        self.record: dict = {}
        self.fc: FaultController | None = None
        self._lock = threading.Lock()

    @property
    def killed(self) -> list[int]:
        return self.fc.killed if self.fc is not None else []

    @property
    def healed(self) -> bool:
        return self.fc is not None and self.fc.healed

    def env(self, run_dir: Path) -> dict[str, str]:
        self.dir = run_dir / "chaos"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fc = FaultController(
            self.faults,
            self.dir / "t0",
            heal_s=self.schedule.heal_s,
            seed=self.schedule.seed,
            history=self.history,
            workload=self._workload,
            on_heal=lambda: self._send_many("post-heal", 2, 300.0),  # the engine must still serve
        )
        return {**self.fc.env(), "HCTOOL_CHAOS_DIR": str(self.dir), "HCTOOL_CHAOS_STARVE_TICKS": str(self.starve_ticks)}

    def started(self, topo, url: str, driver, t0: float) -> None:
        self.topo, self.url, self.driver = topo, url, driver
        self.fc.started(t0, url=url)

    def tick(self) -> None:
        self.fc.tick(self.topo.pids_by_rank())
        if not self.fc.healed and self.driver.done.is_set():
            self.last_progress = time.monotonic()  # waiting for the heal is not a stall
            if self.schedule.heal_s is None:
                self.fc.heal()

    def counts(self) -> list[dict]:
        return self.fc.counts() if self.fc is not None else []

    def _workload(self, f: Fault) -> None:
        self._send_many(f.kind, f.n, f.ms / 1000.0 if f.kind == "request-cancel" else 300.0, f.spec())

    def _send_many(self, kind: str, n: int, timeout: float, salt: str = "") -> None:
        """n workload prompts (drawn from the schedule's seed), each from its own client."""
        rng = random.Random(f"{self.schedule.seed}/{self.schedule.index}/{kind}/{salt}")
        for _ in range(n):
            key, prompt = rng.choice(self.prompts)
            tag = (kind, len(self.extra_expected))
            self.extra_expected[tag] = key
            t = threading.Thread(target=self._send, args=(tag, prompt, timeout), daemon=True)
            t.start()
            self.threads.append(t)

    def _send(self, tag, prompt, timeout: float) -> None:
        body = {
            "input_ids": prompt,
            "rid": f"chaos-{tag[0]}-{tag[1]}-{time.monotonic_ns()}",
            "sampling_params": {"max_new_tokens": self.max_new_tokens, "temperature": 0, "ignore_eos": True},
        }
        try:
            resp = requests.post(f"{self.url}/generate", json=body, timeout=timeout)
            data = resp.json() if resp.status_code == 200 else None
        except (requests.RequestException, ValueError):
            data = None
        with self._lock:
            self.last_progress = time.monotonic()
            if data is not None:
                self.extra[tag], self.extra_meta[tag] = data["output_ids"], data.get("meta_info") or {}
            elif tag[0] == "request-cancel":
                self.cancelled += 1
            else:
                self.extra_failed += 1

    def idle(self) -> bool:
        """The run may end: healed, nothing paused, every extra request answered."""
        return self.healed and self.fc.idle() and all(not t.is_alive() for t in self.threads)

    def quiesce(self, topo, url: str, driver) -> None:
        """Wait (at most QUIESCE_S) until every rank's probe has written an accounting
        record since now with nothing in flight (backups landed), then read /metrics."""
        since, deadline = time.time(), time.monotonic() + QUIESCE_S
        paths = [self.dir / f"quiesce-rank{r}.json" for r in topo.pids_by_rank()]
        while time.monotonic() < deadline and not all(_settled(p, since) for p in paths):
            time.sleep(0.05)
        self.history.add("quiesced")
        try:
            self.metrics_text = requests.get(f"{url}/metrics", timeout=10).text
        except requests.RequestException as exc:
            self.history.add("metrics-unreadable", error=str(exc))

    def finished(self, obs, driver, topo, codes) -> None:
        self.history.add("torn-down", outcome=obs.outcome)
        self.release()
        pids = [c.popen.pid for c in topo.procs.children]
        self.record = {"obs": obs, "driver": driver, "orphans": [p for p in pids if _alive(p)]}

    def release(self) -> None:
        """Never leave a stopped process behind, whatever happened."""
        if self.fc is not None:
            self.fc.release()


def _settled(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime > since and json.loads(path.read_text()).get("in_flight") == 0
    except (OSError, ValueError):
        return False
