"""The plugin's settings, read by the controller and the rank worker alike."""

from __future__ import annotations

import pytest


def settings(config: pytest.Config) -> tuple[str, float, float]:
    """(backend, timeout, hang_after): command line over ini over defaults."""
    backend = config.getoption("hctool_backend") or config.getini("hctool_backend") or "gloo"
    timeout = config.getoption("hctool_timeout") or float(config.getini("hctool_timeout"))
    hang_after = config.getoption("hctool_hang_after") or float(config.getini("hctool_hang_after"))
    return backend, timeout, hang_after
