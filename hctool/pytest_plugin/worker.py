"""The plugin's side inside one rank process: pytest runs the one test id it was
given; this sets up torch.distributed around it and records each phase's
outcome for the controller, appending one JSON line per phase so a rank killed
later still leaves what it had done. A failure's traceback keeps the user's
frames only (hctool's recorder and torch.distributed's wrappers sit between the
test's `dist.all_reduce` line and the exception, and pytest printed torch's
whole `all_reduce` source for them); the entry says how many were hidden, and
where the user's code last was."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

OUTCOMES = "outcome-rank{rank}.jsonl"
# pytest's own outcomes (skip, xfail, exit, fail(pytrace=False)): no traceback of the user's to trim
_OUTCOMES = (pytest.skip.Exception, pytest.xfail.Exception, pytest.exit.Exception)
# the plugin's own fixtures (this package's __init__), left out of a failure's argument list
FIXTURES = ("rank", "world_size", "group")
MAX_EXCEPTION = 4000  # characters of an exception's text kept (a tensor's repr can be megabytes)


class RankWorker:
    def __init__(self, config: pytest.Config):
        from hctool.pytest_plugin.options import settings

        self.dir = config.getoption("hctool_worker")
        self.rank = int(os.environ.get("RANK", "0"))
        self.backend, self.timeout, _ = settings(config)
        self.failed = False
        self.rootpath = config.rootpath
        self.invocation_dir = config.invocation_params.dir  # the controller's: the ranks start there
        self.fulltrace = bool(config.getoption("fulltrace", False))
        self.trimmed: dict[str, dict] = {}  # phase -> what its traceback lost and where it points

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        excinfo = call.excinfo
        if report.failed and excinfo is not None and not isinstance(excinfo.value, _OUTCOMES):
            self.trimmed[call.when] = self._trim(item, report, excinfo)
        return report

    def _trim(self, item: pytest.Item, report: pytest.TestReport, excinfo: pytest.ExceptionInfo) -> dict:
        """Render the traceback again with the user's frames only (pytest's own filter first,
        then ours); returns where the user's code raised and how many frames were hidden."""
        from _pytest._code.code import ExceptionRepr, Traceback

        from hctool.pytest_plugin.frames import is_hidden

        def pytest_filter(ei: pytest.ExceptionInfo) -> Traceback:
            # pytest's cut to the test function and its __tracebackhide__ (Function only)
            return item._traceback_filter(ei) if isinstance(item, pytest.Function) else ei.traceback

        def user_only(ei: pytest.ExceptionInfo) -> Traceback:
            shown = pytest_filter(ei)
            mine = [e for e in shown if not is_hidden(str(e.path))]
            return Traceback(mine) if mine else shown

        shown = list(pytest_filter(excinfo))
        mine = user_only(excinfo)
        hidden = 0 if self.fulltrace else len(shown) - len(mine)
        style = item.config.getoption("tbstyle", "auto")
        # native is Python's own format, which no filter touches; any other longrepr is pytest's
        # own short form (a failed fixture lookup, pytest.fail(pytrace=False))
        if style != "native" and isinstance(report.longrepr, ExceptionRepr):
            verbose = item.config.get_verbosity() > 1
            report.longrepr = excinfo.getrepr(
                funcargs=True,
                showlocals=bool(item.config.getoption("showlocals", False)),
                style="long" if style in ("auto", "long") else style,
                tbfilter=pytest_filter if self.fulltrace else user_only,
                truncate_locals=not verbose,
                truncate_args=not verbose,
            )
            _drop_plugin_args(report.longrepr)
        crash = mine[-1] if mine else None
        return {
            "exception": excinfo.exconly()[:MAX_EXCEPTION],
            "hidden": 0 if self.fulltrace else hidden,
            "crash": None
            if crash is None
            else {"path": self._relative(str(crash.path)), "line": crash.lineno + 1, "func": crash.name},
        }

    def _relative(self, path: str) -> str:
        """As pytest names a file: from where it was started, else from the rootdir."""
        for base in (self.invocation_dir, self.rootpath):
            try:
                return str(Path(path).relative_to(base))
            except ValueError:
                continue
        return path

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
            entry["longrepr"] = _text(report.longrepr)
            entry.update(self.trimmed.get(report.when, {}))
        elif report.skipped and isinstance(report.longrepr, tuple):
            entry["reason"] = report.longrepr[2]
        path = os.path.join(self.dir, OUTCOMES.format(rank=self.rank))
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def _text(longrepr) -> str:
    """The longrepr as pytest prints it, plain; str() would strip the first source line's indent."""
    if not hasattr(longrepr, "toterminal"):
        return str(longrepr)
    from _pytest._io import TerminalWriter

    buf = io.StringIO()
    tw = TerminalWriter(file=buf)
    tw.hasmarkup = False
    longrepr.toterminal(tw)
    return buf.getvalue().strip("\n")


def _drop_plugin_args(longrepr) -> None:
    """The test's arguments pytest lists above its source, without the plugin's own fixtures:
    the failure's heading names the rank already, and `group` reads
    `<ProcessGroup object at 0x7f...>`. The user's fixtures and parameters stay."""
    from _pytest._code.code import ReprFuncArgs

    for reprtraceback, _, _ in getattr(longrepr, "chain", ()):
        for entry in reprtraceback.reprentries:
            args = getattr(entry, "reprfuncargs", None)
            if args is not None:
                kept = [(name, value) for name, value in args.args if name not in FIXTURES]
                entry.reprfuncargs = ReprFuncArgs(kept) if kept else None


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
