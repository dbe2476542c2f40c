"""The plugin's settings, read by the controller and the rank worker alike."""

from __future__ import annotations

import pytest

from hctool.protocol.limits import bounded


def settings(config: pytest.Config) -> tuple[str, float, float]:
    """(backend, timeout, hang_after): command line over ini over defaults, each a finite number
    within its row of hctool/protocol/limits.py, else pytest.UsageError (one `ERROR:` line before
    any test runs: `--hctool-timeout nan` failed a passing test with a ValueError from its
    timedelta, and `inf` too)."""
    backend = config.getoption("hctool_backend") or config.getini("hctool_backend") or "gloo"
    timeout = _seconds(config, "timeout")
    hang_after = _seconds(config, "hang_after")
    return backend, timeout, hang_after


def _seconds(config: pytest.Config, name: str) -> float:
    option = f"--hctool-{name.replace('_', '-')}"
    raw = config.getoption(f"hctool_{name}")
    where = option
    if raw is None:
        raw, where = config.getini(f"hctool_{name}"), f"ini hctool_{name}"
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{where} must be a number of seconds, got {raw!r}") from None
    try:
        return bounded(option, value, where)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def marker_seconds(value, name: str, test: str) -> float:
    """A world_size marker's timeout= or hang_after=, bounded like the options: a bad one fails
    that test with one line."""
    try:
        return bounded(f"--hctool-{name.replace('_', '-')}", value, f"@pytest.mark.world_size({name}=) of {test}")
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)
