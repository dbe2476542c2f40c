"""Shared fixtures. Every test that starts processes must leave none behind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]

# Multi-rank tests (@pytest.mark.world_size) need the plugin; where hctool is installed its
# pytest11 entry point has loaded it already under this name, and this is a no-op.
pytest_plugins = ["hctool.pytest_plugin"]


@pytest.fixture
def no_leftover_processes():
    """Fail the test if it leaves child processes of this interpreter running."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    leftover = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(leftover, timeout=5)
    for p in alive:
        p.kill()
    assert not alive, f"processes left behind: {[(p.pid, p.cmdline()) for p in alive]}"


@pytest.fixture
def hctool_cmd():
    """The CLI as a user runs it, in a real subprocess."""
    return [sys.executable, "-m", "hctool"]


@pytest.fixture
def clean_env():
    env = dict(os.environ)
    env.pop("HCTOOL_DEBUG", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="session", autouse=True)
def c10d_kernel_built():
    """check-consensus builds its C++ capture kernel on first use (~20 s here, then cached):
    build it once up front so that no test's timeout pays for it."""
    from hctool.consensus import kernel_build

    kernel_build.ensure_built()
