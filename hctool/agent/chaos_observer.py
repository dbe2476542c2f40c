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

SCHEDULERS = ("engine.managers.scheduler",)


def _write(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)  # the checker never reads half a record


class _View:
    """The scheduler's parts the probe reads (managers/ layout)."""

    def __init__(self, s):
        self.s = s
        self.alloc = s.model_runner.token_to_kv_pool_allocator
        self.req_pool = s.model_runner.req_to_token_pool
        self.tree = s.tree_cache
        self.waiting, self.running = s.prefill.waiting_queue, s.decode.running
        self.prefetching = len(getattr(self.tree, "ongoing_prefetch", ()))

    def pages_in_use(self) -> int:
        return self.s.resources.pages_in_use(self.running)


def queue_state(v: _View) -> dict:
    return {"tick": v.s.ticks, "waiting": len(v.waiting), "running": len(v.running), "prefetching": v.prefetching,
            "l1_free_now": v.alloc.available_size(), "l1_free_logical": v.alloc.logical_available_size(),
            "evictable": v.tree.evictable_size(), "protected": v.tree.protected_size(),
            "req_slots_free": v.req_pool.available_size(), "head": [len(r.fill_ids) for r in v.waiting[:4]]}


def accounting(v: _View) -> dict:
    """free + cached + in use per tier, locks and references left, queues in flight."""
    t, alloc, p = v.tree, v.alloc, v.alloc.page_size
    nodes = list(t.nodes())
    out = {"tick": v.s.ticks, "l1": {"total": alloc.num_pages, "free": alloc.logical_available_size() // p,
                                     "cached": t.device_pages_in_tree(), "in_use": v.pages_in_use()},
           "locked_nodes": [n.id for n in nodes if n.lock_ref > 0],
           "req_slots": {"total": v.req_pool.size, "free": v.req_pool.available_size()},
           "host_ref_nodes": [n.id for n in nodes if n.host_ref > 0], "in_flight": 0}
    host = getattr(t, "host_allocator", None)
    if host is not None:
        c, io = t.cache_controller, getattr(t, "storage_io", None)
        out["l2"] = {"total": host.num_pages, "free": host.logical_available_size() // p, "used": t.host_pages_in_use()}
        out["in_flight"] = (len(c.ack_write_queue) + len(c.ack_load_queue) + v.prefetching
                            + (len(io.ack_backup_queue) if io else 0))
    return out


def after_tick(v: _View, state: dict, out_dir: str, limit: int) -> None:
    rank = v.s.tp_rank
    if v.waiting and not v.running and not v.prefetching:
        state["starved"] += 1
        if state["starved"] >= limit and not state["reported"]:
            state["reported"] = True
            _write(os.path.join(out_dir, f"starved-rank{rank}.json"),
                   {"rank": rank, "ticks": state["starved"], "state": queue_state(v)})
    else:
        state["starved"] = 0
    now = time.monotonic()
    if not v.waiting and not v.running and now - state["last"] > 0.25:
        state["last"] = now
        _write(os.path.join(out_dir, f"quiesce-rank{rank}.json"), {"rank": rank, **accounting(v)})


def _patch(mod) -> None:
    out_dir = os.environ.get("HCTOOL_CHAOS_DIR")
    cls = mod.Scheduler
    if not out_dir or getattr(cls, "_hctool_chaos_probe", False):
        return
    limit = int(os.environ.get("HCTOOL_CHAOS_STARVE_TICKS", "1000"))
    state = {"starved": 0, "reported": False, "last": 0.0}

    def probe(s) -> None:
        try:
            after_tick(_View(s), state, out_dir, limit)
        except Exception as exc:  # a probe must never break the rank
            state["error"] = repr(exc)

    init = cls.__init__

    def probed_init(self, *a, **kw):  # each tick ends with io.flush(): look right after it
        init(self, *a, **kw)
        flush = self.io.flush

        def flush_then_probe(*fa, **fkw):
            flush(*fa, **fkw)
            probe(self)
        self.io.flush = flush_then_probe
    cls.__init__ = probed_init
    cls._hctool_chaos_probe = True


for _name in SCHEDULERS:
    when_imported(_name, _patch)
