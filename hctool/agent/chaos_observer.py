"""The chaos observer: a tick observer of hctool's engine (engine/lab/snapshot.py), loaded
in every rank of a chaos run (through HCTOOL_PROBES). It reads each tick's snapshot and
writes two kinds of evidence into HCTOOL_CHAOS_DIR, never touching the engine:
- `quiesce-rank{r}.json`: the resource accounting of every tier whenever the rank is idle
  (nothing waiting or running), rewritten at most every 0.25 s;
- `starved-rank{r}.json`: written once when work waited while nothing ran and nothing was
  prefetching for HCTOOL_CHAOS_STARVE_TICKS ticks in a row, with the queue state then.
It reads only the snapshot's typed fields, so a renamed engine field fails take_snapshot
(and tests/engine/test_lab.py) instead of blinding chaos; an error here is written to the
evidence folder (observer-error-rank{r}.json), which the chaos checkers report.
"""

from __future__ import annotations

import json
import os

from hctool.agent.clock import REAL
from hctool.agent.hooks import when_imported
from hctool.protocol import env as protocol_env

QUIESCE_EVERY_S = 0.25


def _write(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with REAL.open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)  # the checker never reads half a record


def queue_state(snap) -> dict:
    r, loc = snap.replicated, snap.local
    return {
        "tick": snap.tick,
        "waiting": len(r.waiting),
        "running": len(r.running),
        "prefetching": len(r.ongoing_prefetch),
        "l1_free_now": loc.device_free_now,
        "l1_free_logical": r.device_free_logical,
        "evictable": loc.evictable_tokens,
        "protected": loc.protected_tokens,
        "req_slots_free": loc.req_slots_free,
        "head": list(loc.waiting_head_tokens),
    }


def accounting(snap) -> dict:
    """free + cached + in use per tier, locks and references left, queues in flight."""
    r, loc, p = snap.replicated, snap.local, snap.page_size
    out = {
        "tick": snap.tick,
        "l1": {
            "total": loc.device_pages_total,
            "free": r.device_free_logical // p,
            "cached": sum(n.device_pages or 0 for n in r.nodes),
            "in_use": loc.pages_in_use,
        },
        "locked_nodes": [n.id for n in r.nodes if n.lock_ref > 0],
        "req_slots": {"total": loc.req_slots_total, "free": loc.req_slots_free},
        "host_ref_nodes": [n.id for n in r.nodes if n.host_ref > 0],
        "in_flight": snap.in_flight,
    }
    if loc.host_pages_total is not None:
        out["l2"] = {"total": loc.host_pages_total, "free": r.host_free_logical // p, "used": loc.host_pages_used}
    return out


class ChaosObserver:
    def __init__(self, out_dir: str, starve_ticks: int) -> None:
        self.out_dir, self.limit = out_dir, starve_ticks
        self.starved, self.reported, self.last = 0, False, 0.0
        self.failed = False

    def __call__(self, snap) -> None:
        if self.failed:
            return
        try:
            self.observe(snap)
        except Exception as exc:  # never break the rank; say so where the checkers look
            self.failed = True
            try:
                _write(
                    os.path.join(self.out_dir, f"observer-error-rank{snap.rank}.json"),
                    {"rank": snap.rank, "error": f"{type(exc).__name__}: {exc}"},
                )
            except OSError:
                pass

    def observe(self, snap) -> None:
        r = snap.replicated
        if r.waiting and not r.running and not r.ongoing_prefetch:
            self.starved += 1
            if self.starved >= self.limit and not self.reported:
                self.reported = True
                _write(
                    os.path.join(self.out_dir, f"starved-rank{snap.rank}.json"),
                    {"rank": snap.rank, "ticks": self.starved, "state": queue_state(snap)},
                )
        else:
            self.starved = 0
        now = REAL.monotonic()
        if snap.idle and now - self.last > QUIESCE_EVERY_S:
            self.last = now
            _write(os.path.join(self.out_dir, f"quiesce-rank{snap.rank}.json"), {"rank": snap.rank, **accounting(snap)})


def install_from_env() -> None:
    out_dir = os.environ.get(protocol_env.CHAOS_DIR)
    if not out_dir:
        return
    observer = ChaosObserver(out_dir, int(os.environ.get(protocol_env.CHAOS_STARVE_TICKS, "1000")))
    when_imported("engine.lab.snapshot", lambda snapshot: snapshot.add_tick_observer(observer))


install_from_env()  # loaded as a probe module: installing is what importing it means
