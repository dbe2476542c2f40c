"""The plugin's side inside one rank process: pytest runs the one test id it was
given; this sets up torch.distributed around it and records each phase's
outcome (with the traceback text) for the controller, appending one JSON line
per phase so a rank killed later still leaves what it had done."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import pytest

OUTCOMES = "outcome-rank{rank}.jsonl"


class RankWorker:
    def __init__(self, config: pytest.Config):
        from hctool.pytest_plugin.options import settings

        self.dir = config.getoption("hctool_worker")
        self.rank = int(os.environ.get("RANK", "0"))
        self.backend, self.timeout, _ = settings(config)
        self.failed = False

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            return
        device_id = None
        if self.backend == "nccl":
            import torch

            device_id = torch.device("cuda", int(os.environ.get("LOCAL_RANK", self.rank)))
            torch.cuda.set_device(device_id)
        # The controller's deadline ends a hang first; this one only bounds a rank left alone.
        dist.init_process_group(self.backend, timeout=timedelta(seconds=self.timeout + 30), device_id=device_id)

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem):
        yield
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        """The one test is done and reported: leave now. pytest's session end (terminal
        summary hooks of other plugins, repeated gc passes over torch's objects) and
        interpreter teardown cost seconds per rank and tell the controller nothing."""
        from hctool.agent.capture import state, tracefile

        if state.enabled():
            tracefile.write_end()  # the end record atexit would have written
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if self.failed else 0)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.failed = self.failed or report.failed
        entry = {
            "rank": self.rank,
            "when": report.when,
            "outcome": report.outcome,
            "t": time.time(),
            "duration": report.duration,
        }
        if report.failed:
            entry["longrepr"] = str(report.longrepr)
        elif report.skipped and isinstance(report.longrepr, tuple):
            entry["reason"] = report.longrepr[2]
        path = os.path.join(self.dir, OUTCOMES.format(rank=self.rank))
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def read_outcomes(trace_dir: str) -> dict[int, list[dict]]:
    """{rank: [phase entries]} from the files the ranks wrote."""
    out: dict[int, list[dict]] = {}
    for name in os.listdir(trace_dir):
        if name.startswith("outcome-rank") and name.endswith(".jsonl"):
            with open(os.path.join(trace_dir, name)) as f:
                for line in f:
                    if line.strip():
                        e = json.loads(line)
                        out.setdefault(e["rank"], []).append(e)
    return out
