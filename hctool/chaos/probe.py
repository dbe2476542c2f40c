"""In-rank probe for chaos runs (imported through HCTOOL_PROBES in every rank).

It reads engine state after each scheduler tick and writes two kinds of
evidence into HCTOOL_CHAOS_DIR, never touching the engine's state or groups:
- `quiesce-rank{r}.json`: the resource accounting of every tier whenever the
  rank is idle (nothing waiting or running), rewritten at most every 0.25 s;
- `starved-rank{r}.json`: written once when work waited while nothing ran and
  nothing was prefetching for HCTOOL_CHAOS_STARVE_TICKS ticks in a row, with
  the queue and pool state at that moment.
"""

from __future__ import annotations

import json
import os
import time

from hctool.inject.faults import when_imported

SCHEDULERS = ("engine.scheduler", "engine.managers.scheduler")


def _write(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)  # the checker never reads half a record


def queue_state(s) -> dict:
    t = s.tree_cache
    alloc = s.token_to_kv_pool_allocator
    hicache = getattr(s, "hicache", False)
    return {"tick": s.ticks, "waiting": len(s.waiting_queue), "running": len(s.running),
            "prefetching": len(t.ongoing_prefetch) if hicache else 0,
            "l1_free_now": alloc.available_size(), "l1_free_logical": alloc.logical_available_size(),
            "evictable": t.evictable_size(), "protected": t.protected_size(),
            "req_slots_free": s.req_to_token_pool.available_size(),
            "head": [len(r.fill_ids) for r in s.waiting_queue[:4]]}


def accounting(s) -> dict:
    """free + cached + in use per tier, locks and references left, queues in flight."""
    t, p = s.tree_cache, s.page_size
    alloc = s.token_to_kv_pool_allocator
    nodes = list(t.nodes())
    out = {"tick": s.ticks, "l1": {"total": alloc.num_pages, "free": alloc.logical_available_size() // p,
                                   "cached": t.device_pages_in_tree(), "in_use": s.pages_in_use()},
           "locked_nodes": [n.id for n in nodes if n.lock_ref > 0],
           "req_slots": {"total": s.req_to_token_pool.size, "free": s.req_to_token_pool.available_size()},
           "host_ref_nodes": [n.id for n in nodes if n.host_ref > 0], "in_flight": 0}
    if getattr(s, "hicache", False):
        c, io = t.cache_controller, getattr(t, "storage_io", None)
        out["l2"] = {"total": t.host_allocator.num_pages, "free": t.host_allocator.logical_available_size() // p,
                     "used": t.host_pages_in_use()}
        out["in_flight"] = (len(c.ack_write_queue) + len(c.ack_load_queue) + len(t.ongoing_prefetch)
                            + (len(io.ack_backup_queue) if io else 0))
    return out


def _patch(mod) -> None:
    out_dir = os.environ.get("HCTOOL_CHAOS_DIR")
    if not out_dir or getattr(mod.Scheduler, "_hctool_chaos_probe", False):
        return
    limit = int(os.environ.get("HCTOOL_CHAOS_STARVE_TICKS", "1000"))
    run_tick = mod.Scheduler.run_tick
    state = {"starved": 0, "reported": False, "last": 0.0}

    def probed_run_tick(self):
        run_tick(self)
        try:
            rank = self.tp_rank
            prefetching = len(self.tree_cache.ongoing_prefetch) if getattr(self, "hicache", False) else 0
            if self.waiting_queue and not self.running and not prefetching:
                state["starved"] += 1
                if state["starved"] >= limit and not state["reported"]:
                    state["reported"] = True
                    _write(os.path.join(out_dir, f"starved-rank{rank}.json"),
                           {"rank": rank, "ticks": state["starved"], "state": queue_state(self)})
            else:
                state["starved"] = 0
            now = time.monotonic()
            if not self.waiting_queue and not self.running and now - state["last"] > 0.25:
                state["last"] = now
                _write(os.path.join(out_dir, f"quiesce-rank{rank}.json"), {"rank": rank, **accounting(self)})
        except Exception as exc:  # a probe must never break the rank
            state["error"] = repr(exc)

    mod.Scheduler.run_tick = probed_run_tick
    mod.Scheduler._hctool_chaos_probe = True


for _name in SCHEDULERS:
    when_imported(_name, _patch)
