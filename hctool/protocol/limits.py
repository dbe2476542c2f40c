"""Bounds of every number that reaches a deadline, a sleep or a trace, in one table: hctool's
command-line options (checked by hctool/console/optlimits.py before a command runs), fault fields (an
--inject text, a schedule file, a scenario), a chaos schedule's heal, the gate's step timeouts
and the pytest plugin's options. The engine's flags keep theirs in engine/server_args.py.

NaN fails every comparison a deadline makes (it means "never"), an infinity is "forever", and a
huge finite value overflows where it meets the OS (time.sleep(1e297) is OverflowError; a window
of 1e303 s ends at inf and prints `Infinity` in a trace): so a value must be finite and within
its row, or it is refused with one line naming where it came from. Standard library only: the
ranks parse faults with it too."""

from __future__ import annotations

import math

DAY = 86_400.0
LIMITS: dict[str, tuple[float, float]] = {
    # command-line options: counts of things
    "--tp": (1, 4096),
    "--pp": (1, 64),  # launch: pipeline stages (engine's --pp-size bound)
    "--dp": (1, 1024),  # launch: data-parallel replicas (engine's --dp-size bound)
    "--prefill-tp": (1, 4096),
    "--decode-tp": (1, 4096),
    "--nproc": (1, 4096),
    "--jobs": (1, 1024),
    "--runs": (1, 10_000),
    "--rounds": (1, 10_000),
    "--replays": (0, 10_000),
    "--max-schedules": (1, 1 << 20),
    "--max-calls-per-rank": (1, 1 << 31),
    "--starve-ticks": (1, 1 << 30),
    "--seed": (0, 2**63 - 1),
    "--port": (0, 65_535),
    # command-line options: seconds
    "--timeout": (0.1, 7 * DAY),
    "--startup-timeout": (0.1, 7 * DAY),
    "--hang-after": (0.1, DAY),
    "--budget": (1, 30 * DAY),
    "--shrink-budget": (0, 30 * DAY),
    "--horizon": (1, DAY),
    # pytest plugin (--hctool-timeout / ini hctool_timeout, seconds per multi-rank test)
    "--hctool-timeout": (0.1, 7 * DAY),
    "--hctool-hang-after": (0.1, DAY),
    # fault fields: a magnitude is slept or added to a clock (ms; pages=N is held here too)
    "fault ms": (0, DAY * 1000),
    "fault p": (0, 1),
    "fault start_s": (0, 30 * DAY),
    "fault duration_s": (0, 30 * DAY),
    "fault at_call": (1, 1 << 40),  # a collective's number in one rank
    # chaos schedule file
    "heal_s": (0, 30 * DAY),
    # [tool.hctool.gate.timeouts] and the chaos step's budget, seconds
    "gate timeout": (0.1, 7 * DAY),
    "gate chaos budget": (1, 30 * DAY),
}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def bounded(name: str, value, what: str | None = None) -> float:
    """`value` as a float when it is a finite number within LIMITS[name]; else ValueError with
    one line (`what` names it for the user, default the row's name)."""
    low, high = LIMITS[name]
    label = what or name
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{label} must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        raise ValueError(f"{label} must be between {_num(low)} and {_num(high)}, got {value}") from None
    if not math.isfinite(number):
        raise ValueError(f"{label} must be a finite number, got {value!r}")
    if not low <= number <= high:
        raise ValueError(f"{label} must be between {_num(low)} and {_num(high)}, got {value:g}")
    return number
