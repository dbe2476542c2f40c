"""Declared seams: the only places where something outside the engine (hctool's faults) may
change what a rank does. Each seam is a callable with a no-op default that the engine calls
at one point; `SEAMS.install(name=fn)` replaces one and refuses a name that is not declared,
so renaming a seam fails the installer (and tests/engine/test_lab.py) instead of silently
blinding a fault. Faults only change timing and rank-local resources through these.

Clocks are not seams: hctool's clock faults act on the `time` module of the whole rank, as a
real clock would, so every reader (`PrefetchOperation.start_time`, the wall-clock LRU, the
waiting timeout) sees the same skewed time. `POINTS` names the engine functions (and
threads) that hctool's by-name faults and probes may target (`delay:fn=...`, `raise:fn=...`,
`thread-slow:thread=...`, a repro's probe).
"""

from __future__ import annotations

from collections.abc import Callable


def _no_delay(*_args) -> float:
    return 0.0


def _same(n: int) -> int:
    return n


def _never() -> bool:
    return False


# name -> (what the engine passes and expects, the no-op default)
DECLARED: dict[str, tuple[str, Callable]] = {
    "copy_delay_ms": (
        "(stream: 'h2d'|'d2h') -> ms to wait before the next copy on that stream "
        "(a CPU sleep on the stream's worker, torch.cuda._sleep on CUDA)",
        _no_delay,
    ),
    "free_delay_ms": ("() -> ms by which freed device pages return to the free list late", _no_delay),
    "storage_exists": ("(pages: int) -> the pages this rank's storage reports present", _same),
    "host_pool_pages": ("(pages: int) -> the pages this rank's host pool really gets", _same),
    "kv_send_delay_ms": ("() -> ms before a PD prefill rank pushes a request's KV", _no_delay),
    "kv_dropped": ("() -> whether a PD prefill rank's KV parts are lost", _never),
    "bootstrap_delay_ms": ("() -> ms before a PD decode rank registers with the bootstrap server", _no_delay),
}

# What hctool's by-name faults and probes may target in the engine: a stable name ->
# `module:Qualname` (or a thread name). tests/engine/test_lab.py resolves every entry.
POINTS: dict[str, str] = {
    "storage_get": "engine.mem_cache.hicache_storage:HiCacheFile.batch_get",
    "storage_query": "engine.mem_cache.hicache_storage:HiCacheFile.batch_exists",
    "storage_set": "engine.mem_cache.hicache_storage:HiCacheFile.batch_set",
    "prefetch_thread": "hicache-prefetch",
    "backup_thread": "hicache-backup",
    "loading_check": "engine.mem_cache.hiradix_cache:HiRadixCache.loading_check",
    "restore_steps": "engine.disaggregation.decode_hicache_mixin",  # the module whose methods are the phases
}


class Seams:
    """The installed seams; attribute access is the engine's call (no lookup per call)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        for name, (_, default) in DECLARED.items():
            setattr(self, name, default)

    def install(self, **hooks: Callable) -> None:
        unknown = sorted(set(hooks) - set(DECLARED))
        if unknown:
            raise KeyError(f"no engine seam named {', '.join(unknown)}; declared: {', '.join(DECLARED)}")
        for name, fn in hooks.items():
            setattr(self, name, fn)


SEAMS = Seams()
