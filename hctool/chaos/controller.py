"""The harness hooks of one chaos run: they write the fault clock's start, carry
out the controller faults (pause, kill, bursts, cancellations) at their times,
log every fault on and off to the history, heal, wait for quiesce and read
/metrics before teardown."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import psutil
import requests

from hctool.chaos.history import History
from hctool.chaos.schedule import Schedule
from hctool.protocol.faults import CONTROLLER, Fault
from hctool.protocol.safefile import write_atomic

QUIESCE_S = 3.0  # the chaos observer rewrites its record every 0.25 s while a rank is idle


class Controller:
    """The harness hooks of one chaos run."""

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
        self.paused: dict[int, float] = {}  # pid -> when to continue
        self.killed: list[int] = []
        self.threads: list[threading.Thread] = []
        self.metrics_text: str | None = None
        self.healed = False
        self.last_progress = 0.0  # monotonic: the harness's stall clock also counts waiting for the heal
        self.record: dict = {}
        self._events: list[tuple[float, str, Fault]] = []
        self._lock = threading.Lock()

    def env(self, run_dir: Path) -> dict[str, str]:
        self.dir = run_dir / "chaos"
        self.dir.mkdir(parents=True, exist_ok=True)
        return {
            "HCTOOL_FAULTS_T0": str(self.dir / "t0"),
            "HCTOOL_CHAOS_DIR": str(self.dir),
            "HCTOOL_CHAOS_STARVE_TICKS": str(self.starve_ticks),
        }

    def started(self, topo, url: str, driver, t0: float) -> None:
        self.topo, self.url, self.driver, self.t0 = topo, url, driver, time.monotonic()
        self.t0_wall = t0
        write_atomic(self.dir / "t0", repr(t0).encode())  # never through a link planted in the folder
        for f in self.faults:
            self._events.append((f.start_s, "on", f))
            if f.duration_s is not None and f.kind not in CONTROLLER:
                self._events.append((f.start_s + f.duration_s, "off", f))
        if self.schedule.heal_s is not None:
            self._events.append((self.schedule.heal_s, "heal", None))
        self._events.sort(key=lambda e: e[0])
        self.history.add("workload-start", url=url)

    def tick(self) -> None:
        now = time.monotonic() - self.t0
        # faults already due fire before an end-of-workload heal: a workload that ends
        # between two ticks must not skip a fault whose window had opened
        while self._events and self._events[0][0] <= now:
            at, what, f = self._events.pop(0)
            if what == "heal":
                self._heal(now)
                continue
            self.history.add(f"fault-{what}", at_s=round(now, 2), fault=f.spec())
            if what == "on" and f.kind in CONTROLLER:
                self._act(f)
        if not self.healed and self.driver.done.is_set():
            self.last_progress = time.monotonic()  # waiting for the heal is not a stall
            if self.schedule.heal_s is None:
                self._heal(now)
        for pid, until in list(self.paused.items()):
            if now >= until:
                self._signal(pid, signal.SIGCONT)
                del self.paused[pid]
                self.history.add("rank-continue", at_s=round(now, 2), pid=pid)

    def _heal(self, now: float) -> None:
        """Every fault is off from now on (the ranks read it from the clock file);
        the engine must still serve, so two more requests go out."""
        if self.healed:
            return
        self.healed = True
        write_atomic(self.dir / "t0", f"{self.t0_wall!r} {now:.3f}".encode())
        self.history.add("heal", at_s=round(now, 2))
        for _, what, f in self._events:  # faults that had not started never will
            if what == "on":
                self.history.add("fault-skipped", fault=f.spec())
        self._events = []
        self._send_many("post-heal", 2, 300.0)

    def _act(self, f: Fault) -> None:
        pids = self.topo.pids_by_rank()
        if f.kind in ("rank-pause", "rank-kill") and f.rank in pids:
            if f.kind == "rank-pause":
                self._signal(pids[f.rank], signal.SIGSTOP)
                self.paused[pids[f.rank]] = time.monotonic() - self.t0 + f.ms / 1000.0
            else:
                self.killed.append(f.rank)
                self._signal(pids[f.rank], signal.SIGKILL)
        elif f.kind in ("request-burst", "request-cancel"):
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

    @staticmethod
    def _signal(pid: int, sig) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def idle(self) -> bool:
        """The run may end: healed, nothing paused, every extra request answered."""
        return self.healed and not self.paused and all(not t.is_alive() for t in self.threads)

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
        for pid in list(self.paused):
            self._signal(pid, signal.SIGCONT)
        self.paused.clear()
        pids = [c.popen.pid for c in topo.procs.children]
        self.record = {"obs": obs, "driver": driver, "orphans": [p for p in pids if _alive(p)]}

    def release(self) -> None:
        """Never leave a stopped process behind, whatever happened."""
        for pid in list(self.paused):
            self._signal(pid, signal.SIGCONT)


def _settled(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime > since and json.loads(path.read_text()).get("in_flight") == 0
    except (OSError, ValueError):
        return False


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
