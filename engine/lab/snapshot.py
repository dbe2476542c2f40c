"""A typed snapshot of one rank's state at one tick, and the observers that read it.

The scheduler takes it once per tick at the agreement step (after the broadcast requests
and the waiting-timeout decisions, before `check_hicache_events`), but only when something
looks: the `--state-digest`, the per-tick integrity check (HCENGINE_CHECK_INTEGRITY), the
status line every few seconds, or an observer added with `add_tick_observer` (hctool's chaos
observer). Every reader of the engine's state reads this one record, so a renamed engine
field breaks `take_snapshot` (and tests/engine/test_lab.py), never a reader silently.

Fields are split by what a TP engine promises: `Replicated` must be identical on every rank
(the digest covers exactly these), `RankLocal` may differ (free-now counts follow each rank's
copy timing). `check_accounting` is the integrity check of both caches: free + cached + in use
== total per tier, plus the tree's structural invariants.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeRow:
    id: int
    parent: int | None  # None: a child of the root
    name: str  # the chain hash of its last page (names the whole prefix on every rank)
    depth: int
    tokens: int
    device_pages: int | None  # None: evicted from L1
    host_pages: int | None  # None: no L2 copy
    backuped: bool
    writing: bool
    lock_ref: int
    host_ref: int
    last_access: float


@dataclass(frozen=True)
class Replicated:
    waiting: tuple[str, ...]  # rids, in queue order
    running: tuple[str, ...]
    ongoing_prefetch: tuple[str, ...]  # insertion order
    ack_queues: tuple[int, int, int]  # write, load, storage backup acks not yet popped
    nodes: tuple[NodeRow, ...]  # canonical order: depth first, children by their first page
    device_free_logical: int  # tokens
    host_free_logical: int | None


@dataclass(frozen=True)
class RankLocal:
    device_free_now: int  # tokens free right now (lags while copies run)
    device_pages_total: int
    pages_in_use: int  # pages held by requests, beyond the tree's
    host_pages_total: int | None
    host_pages_used: int | None  # tree + live prefetches
    req_slots_total: int
    req_slots_free: int
    evictable_tokens: int
    protected_tokens: int
    waiting_head_tokens: tuple[int, ...]  # fill lengths of the first waiting requests
    admission_trimmed: int  # ticks this rank admitted more than its peers


@dataclass(frozen=True)
class TickSnapshot:
    rank: int
    tick: int
    page_size: int
    replicated: Replicated
    local: RankLocal

    @property
    def in_flight(self) -> int:
        """Copies, storage backups and prefetches still to be agreed."""
        return sum(self.replicated.ack_queues) + len(self.replicated.ongoing_prefetch)

    @property
    def idle(self) -> bool:
        return not self.replicated.waiting and not self.replicated.running


TickObserver = Callable[[TickSnapshot], None]
_OBSERVERS: list[TickObserver] = []


def add_tick_observer(fn: TickObserver) -> None:
    """Call fn(snapshot) every tick on this rank. It must not mutate the engine or issue a
    collective; an exception it raises propagates (the engine's own checks raise on purpose)."""
    _OBSERVERS.append(fn)


def tick_observers() -> tuple[TickObserver, ...]:
    return tuple(_OBSERVERS)


# -- taking one -----------------------------------------------------------------------


def tree_rows(tree) -> tuple[NodeRow, ...]:
    rows: list[NodeRow] = []
    stack = [(tree.root, 0)]
    while stack:  # canonical order: children sorted by their first page
        node, depth = stack.pop()
        if node is not tree.root:
            host = getattr(node, "host_value", None)
            rows.append(
                NodeRow(
                    node.id,
                    None if node.parent is tree.root else node.parent.id,
                    node.hash_value[-1][:12] if node.hash_value else "root",
                    depth,
                    len(node.key),
                    None if node.value is None else len(node.value),
                    None if host is None else len(host),
                    node.backuped,
                    node.writing,
                    node.lock_ref,
                    node.host_ref,
                    node.last_access,
                )
            )
        stack.extend((c, depth + 1) for _, c in sorted(node.children.items(), reverse=True))
    return tuple(rows)


def cache_state(tree, waiting=(), running=(), pages_in_use: int = 0):
    """(Replicated, partial RankLocal fields) of a prefix cache alone (tests, check_integrity)."""
    host = getattr(tree, "host_allocator", None)
    c, io = getattr(tree, "cache_controller", None), getattr(tree, "storage_io", None)
    acks = (len(c.ack_write_queue), len(c.ack_load_queue), len(io.ack_backup_queue) if io else 0) if c else (0, 0, 0)
    rep = Replicated(
        tuple(r.rid for r in waiting),
        tuple(r.rid for r in running),
        tuple(tree.ongoing_prefetch),
        acks,
        tree_rows(tree),
        tree.allocator.logical_available_size(),
        None if host is None else host.logical_available_size(),
    )
    return rep, {
        "device_pages_total": tree.allocator.num_pages,
        "pages_in_use": pages_in_use,
        "host_pages_total": None if host is None else host.num_pages,
        "host_pages_used": tree.host_pages_in_use() if host is not None else None,
        "evictable_tokens": tree.evictable_size(),
        "protected_tokens": tree.protected_size(),
    }


def take_snapshot(scheduler) -> TickSnapshot:
    """The snapshot of a Scheduler (engine/managers/scheduler.py) at this point of its tick."""
    s = scheduler
    waiting, running = s.prefill.waiting_queue, s.decode.running
    rep, local = cache_state(s.tree_cache, waiting, running, s.resources.pages_in_use(running))
    alloc, slots = s.model_runner.token_to_kv_pool_allocator, s.model_runner.req_to_token_pool
    return TickSnapshot(
        s.tp_rank,
        s.ticks,
        s.args.page_size,
        rep,
        RankLocal(
            device_free_now=alloc.available_size(),
            req_slots_total=slots.size,
            req_slots_free=slots.available_size(),
            waiting_head_tokens=tuple(len(r.fill_ids) for r in waiting[:4]),
            admission_trimmed=s.prefill.admission_trimmed,
            **local,
        ),
    )


# -- the integrity check --------------------------------------------------------------


def check_accounting(snap_or_state, page_size: int | None = None) -> None:
    """Raise AssertionError at the first broken invariant: per tier free + cached + in use ==
    total (logical counts), keys page-aligned, device pages matching keys, no evicted node
    above a device child, no lock on an evicted node, every node on some tier, no negative
    reference."""
    p: int | None
    if isinstance(snap_or_state, TickSnapshot):
        rep, local, p = snap_or_state.replicated, snap_or_state.local.__dict__, snap_or_state.page_size
    else:
        (rep, local), p = snap_or_state, page_size
    if p is None:
        raise ValueError("check_accounting of a (replicated, local) pair needs its page_size")
    total, in_use = local["device_pages_total"], local["pages_in_use"]
    free = rep.device_free_logical // p
    cached = sum(n.device_pages or 0 for n in rep.nodes)
    if free + cached + in_use != total:
        raise AssertionError(f"L1 leak: free {free} + cached {cached} + in use {in_use} != total {total}")
    on_device = {n.id: n.device_pages is not None for n in rep.nodes}
    for n in rep.nodes:
        if n.tokens % p or not n.tokens:
            raise AssertionError(f"node {n.id} key not page aligned")
        if n.device_pages is not None and n.device_pages * p != n.tokens:
            raise AssertionError(f"node {n.id} device pages do not match its key")
        if n.device_pages is not None and n.parent is not None and not on_device[n.parent]:
            raise AssertionError(f"node {n.parent} evicted above a device child")
        if n.lock_ref < 0 or (n.lock_ref and n.device_pages is None):
            raise AssertionError(f"node {n.id} bad lock_ref {n.lock_ref} (evicted={n.device_pages is None})")
    if local["host_pages_total"] is None:
        return
    if rep.host_free_logical is None:
        raise AssertionError("a host pool without a free count")
    host_free, used, host_total = rep.host_free_logical // p, local["host_pages_used"], local["host_pages_total"]
    if host_free + used != host_total:
        raise AssertionError(f"L2 leak: free {host_free} + used {used} != total {host_total}")
    for n in rep.nodes:
        if n.device_pages is None and n.host_pages is None:
            raise AssertionError(f"node {n.id} has neither device nor host copy")
        if n.host_ref < 0:
            raise AssertionError(f"node {n.id} host_ref {n.host_ref}")


def status_line(snap: TickSnapshot, prefetching: int | None = None) -> str:
    r, loc = snap.replicated, snap.local
    return (
        f"[rank {snap.rank}] tick {snap.tick}: waiting {len(r.waiting)} running {len(r.running)} "
        f"prefetching {len(r.ongoing_prefetch)} L1 free {loc.device_free_now} (logical "
        f"{r.device_free_logical}) evictable {loc.evictable_tokens} admission trimmed {loc.admission_trimmed}x"
    )
