"""In-rank faults: the kinds of hctool/protocol/faults.py whose row says `Acts.RANK`.

One module per family (the row's `family`), each with `KINDS` (the kinds it carries out) and
`install(clock, faults)` (the faults of those kinds this rank got):

  clocks       clock-skew, clock-jump, clock-jitter: the `time` module of the whole rank
  threads      thread-slow: waits of non-main threads
  collectives  collective-delay: before each of the rank's recorded collectives
  cuda         cuda-sleep: a sleep on the rank's CUDA stream (before collectives, or at fn=)
  files        io-delay: `open()`
  named        delay, raise: at a function the spec names (agent/names.py)
  copies, pool, storage, pd: the engine's declared seams and fault points (engine/lab/seams.py);
               none of them touches the engine's state directly

Time runs from the workload's start (common.FaultClock). Each fault counts how often it fired;
counts.py writes them beside the traces. tests/chaos/test_kinds.py holds every in-rank row to
a module here that lists it.
"""

from __future__ import annotations

import importlib
import os

from hctool.agent import counts
from hctool.agent.faults.common import FaultClock
from hctool.protocol import env as protocol_env
from hctool.protocol.faults import KIND, Acts, Fault

__all__ = ["FaultClock", "family_module", "install", "install_from_env", "install_with"]


def family_module(family: str):
    """The installer module of a family (hctool.agent.faults.<family>)."""
    return importlib.import_module(f"{__name__}.{family}")


def install_with(clock: FaultClock, faults: list[Fault]) -> None:
    """Install these faults, each by its family's module, on this clock. A supervisor's fault
    among them is anchored (at_call=K): the rank hands off to the supervisor at that call."""
    clock.handoffs = {f.at_call for f in faults if KIND[f.kind].acts is Acts.SUPERVISOR and f.at_call is not None}
    if any(f.at_call is not None for f in faults):
        from hctool.agent.faults.collectives import before_each_call

        before_each_call(lambda op, group: clock.on_call())  # first: the K-th call itself is in the window
    families: dict[str, list[Fault]] = {}
    for f in faults:
        row = KIND[f.kind]
        if row.acts is Acts.RANK:
            families.setdefault(row.family, []).append(f)
    for family, mine in families.items():
        family_module(family).install(clock, mine)


def install(faults: list[Fault], rank: int) -> None:
    """Install this rank's faults (already filtered for it)."""
    counts.start([f for f in faults if KIND[f.kind].acts is Acts.RANK], rank)  # the supervisor counts its own
    install_with(FaultClock(faults, rank), faults)


def install_from_env() -> list[Fault]:
    """Apply the in-rank faults of HCTOOL_FAULTS that target this rank. A process without
    RANK is not a rank (torchrun's launcher, the engine's frontend): it gets none."""
    import sys

    from hctool.protocol.faults import parse_faults

    faults = parse_faults(os.environ.get(protocol_env.FAULTS, ""))
    if "RANK" not in os.environ:
        return faults
    rank, role = int(os.environ["RANK"]), os.environ.get(protocol_env.ROLE)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mine = [  # the in-rank kinds, and a supervisor's kinds anchored at one of this rank's calls
        f
        for f in (f.resolved(world) for f in faults)
        if (KIND[f.kind].acts is Acts.RANK or f.at_call is not None) and f.applies_to(rank, role)
    ]
    if mine:
        install(mine, rank)
        sys.stderr.write(f"hctool: rank {rank}: faults {'; '.join(f.spec() for f in mine)}\n")
    return faults
