"""Probe for 29483 (observe only, no collective): before every loading_check(), record
a labelled event naming the line of _process_hicache_local_restores that led to it
(Phase A or the Phase B gate). Ranks that pair a Phase A all_reduce with a Phase B
one then disagree on this label, and the consensus check names both lines."""

from hctool.consensus import recorder
from hctool.inject.faults import when_imported

PHASES = {}  # line -> "Phase A" / "Phase B", read from the mixin's source


def _phase_of(lineno: int, mixin) -> str:
    if not PHASES:
        import inspect
        lines, start = inspect.getsourcelines(mixin.DecodeHiCacheMixin._process_hicache_local_restores)
        phase = "before Phase A"
        for i, text in enumerate(lines):
            if "# Phase A" in text:
                phase = "Phase A"
            elif "# Phase B" in text:
                phase = "Phase B"
            elif "# Phase C" in text:
                phase = "Phase C"
            PHASES[start + i] = phase
    return PHASES.get(lineno, "?")


def _install(hiradix):
    import sys

    original = hiradix.HiRadixCache.loading_check

    def loading_check(self):
        caller = sys._getframe(2)  # loading_check <- is_load_back_event_done <- the restore loop
        mixin = sys.modules.get("engine.disaggregation.decode_hicache_mixin")
        where = f"{caller.f_code.co_filename.rsplit('/', 1)[-1]}:{caller.f_lineno}"
        phase = _phase_of(caller.f_lineno, mixin) if mixin else "?"
        recorder.record_label("loading_check entered from", f"{phase} @ {where}", depth=3)
        return original(self)

    hiradix.HiRadixCache.loading_check = loading_check


when_imported("engine.mem_cache.hiradix_cache", _install)
