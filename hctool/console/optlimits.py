"""Bounds of every numeric option of hctool's own commands, in one table (the engine's flags have
theirs in engine/server_args.py NUMBER_LIMITS; the rows are in hctool/protocol/limits.py, with
those of fault fields, schedules, the gate and the pytest plugin). A value that is not a number, NaN, an infinity or
out of range is one `Error:` line and exit 2 before the command runs: `--timeout inf` must not
mean "forever", nor `--hang-after nan` "never" (NaN fails every comparison a deadline makes).

`bound_numbers(command)` puts the check in front of every int/float option of the command tree;
an option missing from the table is a KeyError there, so a new numeric option cannot ship
without bounds (tests/reliability/test_number_flags.py walks the tree).
"""

from __future__ import annotations

import math
import typing

from hctool.console.errors import UsageError
from hctool.protocol.limits import LIMITS

# The options' rows live in the one table of every bounded number (hctool/protocol/limits.py).
OPTION_LIMITS: dict[str, tuple[float, float]] = {k: v for k, v in LIMITS.items() if k.startswith("--")}
COUNTED = ("--verbose",)  # -v -v: a count, no value to check


def numeric_kind(param) -> type | None:
    """int or float for an option whose value is a number (Optional[...] included), else None.
    Typer changed its parameter model: up to 0.2x a param is click's and has a click type
    (INT, FLOAT, IntRange ...); newer typer keeps the annotation in `type_descriptor`.
    pyproject admits both, so both are read (tests/reliability/test_number_flags.py)."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:
        annotation = descriptor.annotation
        kinds = [t for t in (annotation, *typing.get_args(annotation)) if t in (int, float)]
        return kinds[0] if kinds else None
    type_name = getattr(getattr(param, "type", None), "name", "")  # click: "integer", "float range" ...
    return int if type_name.startswith("integer") else float if type_name.startswith("float") else None


def numeric_options(command, path: tuple[str, ...] = ("hctool",)):
    """(command path, option, kind) for every numeric option of the tree."""
    for name, sub in getattr(command, "commands", {}).items():
        yield from numeric_options(sub, (*path, name))
    for param in command.params:
        kind = numeric_kind(param)
        if kind is not None and param.opts[0].startswith("--") and param.opts[0] not in COUNTED:
            yield path, param, kind


def check(option: str, kind: type, raw: str):
    low, high = OPTION_LIMITS[option]
    try:
        value = int(raw) if kind is int else float(raw)
    except ValueError:
        raise UsageError(
            f"{option} must be {'an integer' if kind is int else 'a number'}, got {raw!r}",
            f"see --help; {option} takes a value from {_num(low)} to {_num(high)}",
        ) from None
    if not math.isfinite(value):
        raise UsageError(
            f"{option} must be a finite number, got {raw}",
            f"NaN and infinities are never a setting; {option} takes a value from {_num(low)} to {_num(high)}",
        )
    if not low <= value <= high:
        raise UsageError(f"{option} must be between {_num(low)} and {_num(high)}, got {raw}", "see --help")
    return value


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def bound_numbers(command) -> None:
    """Check every numeric option's command-line value before the command parses it further."""
    for _, param, kind in numeric_options(command):
        option = param.opts[0]
        OPTION_LIMITS[option]  # noqa: B018 - a KeyError here: the option has no bounds yet
        original = param.process_value

        def process_value(ctx, value, _original=original, _option=option, _kind=kind):
            for raw in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(raw, str):
                    check(_option, _kind, raw)
            return _original(ctx, value)

        param.process_value = process_value
