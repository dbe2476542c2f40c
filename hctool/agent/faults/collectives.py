"""collective-delay: a sleep before each of the rank's recorded collectives (the capture layer
calls state.S.before_call), op=/group= narrowing which. The C hot paths do not call Python, so
they are turned off in a rank with such a fault (a chaos run's cost, not a normal run's)."""

from __future__ import annotations

import os
from collections.abc import Callable

from hctool.agent.faults.common import FaultClock, sleep_ms
from hctool.protocol import env as protocol_env
from hctool.protocol.faults import Fault

KINDS = ("collective-delay",)
_before: list[Callable[[str, str], None]] = []


def matching(faults: list[Fault], op: str, group_index: str) -> list[Fault]:
    return [f for f in faults if (f.op is None or f.op == op) and (f.group is None or f.group == group_index)]


def before_each_call(action: Callable[[str, str], None]) -> None:
    """Run action(op, group_index) before each recorded collective of this rank (cuda.py too)."""
    from hctool.agent.capture import state

    if not _before:
        os.environ[protocol_env.FASTPATH] = "0"
        os.environ[protocol_env.C10D_KERNEL] = "0"

        def before_call(op: str, group_index: str) -> None:
            for act in _before:
                act(op, group_index)

        state.S.before_call = before_call
    _before.append(action)


def install(clock: FaultClock, faults: list[Fault]) -> None:
    before_each_call(lambda op, group: sleep_ms(clock.total_ms(KINDS, matching(faults, op, group))))
