"""Probe for 29483 (observe only, no collective): before every loading_check(), record a
labelled event naming the restore step that led to it, found on the stack by its function
(`_poll_restores_in_flight` is Phase A, `_load_back_slot_free` the Phase B gate). Ranks that
pair a Phase A all_reduce with a Phase B one then disagree on this label, and the consensus
check names both lines. Engine names come from engine.lab.POINTS only."""

from engine.lab.seams import POINTS
from hctool.agent import names
from hctool.agent.capture import recorder

MIXIN = POINTS["restore_steps"].rsplit(".", 1)[-1] + ".py"
PHASES = {
    "_poll_restores_in_flight": "Phase A",
    "_load_back_slot_free": "Phase B gate",
    "_start_restore_copies": "Phase C",
}


def _label(caller, args, kwargs) -> None:
    frame = caller
    while frame is not None and not frame.f_code.co_filename.endswith(MIXIN):
        frame = frame.f_back
    where = (
        "outside the restore steps"
        if frame is None
        else f"{PHASES.get(frame.f_code.co_name, frame.f_code.co_name)} @ {MIXIN}:{frame.f_lineno}"
    )
    recorder.record_label("loading_check entered from", where, frame=frame or caller)


names.on_call(POINTS["loading_check"], before=_label)
