"""pytest plugin (entry point `pytest11`): multi-rank tests with the collective recorder on.

    @pytest.mark.world_size(2)
    def test_tp(rank, world_size, group): ...

runs the test function on 2 real ranks, fresh interpreters with torch.distributed
initialised (gloo; `--hctool-backend nccl` on GPUs). The pytest process that
collected the test is the controller: it starts the ranks, watches their traces
live (hctool.consensus) and turns what they did into the test's outcome: the
first divergent collective with each rank's call site, a rank's traceback, or
the stacks of a hang. Each rank runs pytest itself on that one test id (so
parametrization and the user's other fixtures work) and is reaped on every path.

The plugin is inert for tests without the marker: it only adds the marker,
three fixtures and options; torch is imported only inside rank processes.
"""

from __future__ import annotations

import os

import pytest

from hctool.pytest_plugin.failure import SERIAL_KEY, FailureRepr, RanksFailed

MARKER = "world_size"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hctool", "hctool multi-rank tests (@pytest.mark.world_size(n))")
    group.addoption(
        "--hctool-backend",
        choices=("gloo", "nccl"),
        default=None,
        help="torch.distributed backend of multi-rank tests (default gloo; nccl needs one GPU per rank).",
    )
    group.addoption(
        "--hctool-timeout",
        type=str,
        default=None,
        help="Seconds a multi-rank test may take before it fails with every rank's stack (default 120).",
    )
    group.addoption(
        "--hctool-hang-after",
        type=str,
        default=None,
        help="Seconds a collective may wait for a peer that is elsewhere before the test fails as hung (default 10).",
    )
    # Internal: set by the controller on the pytest it starts in each rank process.
    group.addoption("--hctool-worker", default=None, help=argparse_suppress())
    parser.addini("hctool_backend", "torch.distributed backend of multi-rank tests", default="gloo")
    parser.addini("hctool_timeout", "seconds per multi-rank test", default="120")
    parser.addini("hctool_hang_after", "seconds a collective may wait for an absent peer", default="10")


def argparse_suppress() -> str:
    import argparse

    return argparse.SUPPRESS


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(n, timeout=None, hang_after=None): run the test on n torch.distributed ranks "
        "(fixtures rank, world_size, group) with hctool's collective recorder",
    )
    from hctool.pytest_plugin.options import settings

    settings(config)  # a bad --hctool-timeout is refused here, before any test runs
    if config.getoption("hctool_worker"):
        from hctool.pytest_plugin import worker

        config.pluginmanager.register(worker.RankWorker(config), "hctool-rank-worker")


def _is_worker(config: pytest.Config) -> bool:
    return bool(config.getoption("hctool_worker"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A multi-rank failure's report carries the whole finding, so that pytest's terminal prints
    it in the length --tb asks for and its JUnit XML gets the one-line cause as the message."""
    report = yield
    if call.excinfo is not None and isinstance(call.excinfo.value, RanksFailed):
        report.longrepr = FailureRepr(call.excinfo.value.failure, item.config.getoption("tbstyle", "auto"))
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_report_to_serializable(config: pytest.Config, report):
    """pytest-xdist sends a worker's reports to its controller as JSON: the finding goes along."""
    longrepr = getattr(report, "longrepr", None)
    if not isinstance(longrepr, FailureRepr):
        return None
    report.longrepr = str(longrepr)
    try:
        data = report._to_json()
    finally:
        report.longrepr = longrepr
    data["$report_type"] = type(report).__name__
    data[SERIAL_KEY] = longrepr.to_json()
    return data


@pytest.hookimpl(tryfirst=True)
def pytest_report_from_serializable(config: pytest.Config, data: dict):
    if SERIAL_KEY not in data or data.get("$report_type") != "TestReport":
        return None
    report = pytest.TestReport._from_json({k: v for k, v in data.items() if k != SERIAL_KEY})
    report.longrepr = FailureRepr.from_json(data[SERIAL_KEY])
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """In the controller, a marked test's body runs in the rank processes instead."""
    marker = pyfuncitem.get_closest_marker(MARKER)
    if marker is None or _is_worker(pyfuncitem.config):
        return None
    from hctool.pytest_plugin.controller import run_on_ranks

    run_on_ranks(pyfuncitem, marker)
    return True


# Fixtures: real values inside a rank; None in the controller, where the body never runs.


def _in_rank(request: pytest.FixtureRequest) -> bool:
    if request.node.get_closest_marker(MARKER) is None:
        pytest.fail(f"fixture {request.fixturename!r} needs @pytest.mark.{MARKER}(n) on the test", pytrace=False)
    return _is_worker(request.config)


@pytest.fixture
def rank(request: pytest.FixtureRequest) -> int | None:
    return int(os.environ["RANK"]) if _in_rank(request) else None


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> int | None:
    return int(os.environ["WORLD_SIZE"]) if _in_rank(request) else None


@pytest.fixture
def group(request: pytest.FixtureRequest):
    """The default (world) process group of the test's ranks."""
    if not _in_rank(request):
        return None
    import torch.distributed as dist

    return dist.group.WORLD
