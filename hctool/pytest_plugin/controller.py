"""The plugin's side in the pytest process that collected a multi-rank test:
start one pytest per rank on the same test id with the recorder injected
(hctool.consensus.run.run_job watches the traces live, takes stacks and reaps
every process), then turn what the ranks did into this test's outcome."""

from __future__ import annotations

import io
import re
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import pytest

from hctool.consensus.model import Report, Verdict
from hctool.pytest_plugin.worker import read_outcomes

_FRAME = re.compile(r"\.py:\d+\)")


def _marker_args(item: pytest.Function, marker) -> tuple[int, float, float, str]:
    from hctool.pytest_plugin.options import marker_seconds, settings

    backend, timeout, hang_after = settings(item.config)
    n = marker.args[0] if marker.args else marker.kwargs.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        pytest.fail(f"@pytest.mark.world_size needs a positive int rank count, got {n!r}", pytrace=False)
    if marker.kwargs.get("timeout") is not None:
        timeout = marker_seconds(marker.kwargs["timeout"], "timeout", item.nodeid)
    if marker.kwargs.get("hang_after") is not None:
        hang_after = marker_seconds(marker.kwargs["hang_after"], "hang_after", item.nodeid)
    return n, timeout, hang_after, backend


def _rank_command(item: pytest.Function, trace_dir: str, backend: str, timeout: float, hang_after: float) -> list[str]:
    config = item.config
    # An absolute id: the rank's pytest finds the file (and its conftests) from any cwd.
    path, _, rest = item.nodeid.partition("::")
    node = f"{(config.rootpath / path).resolve()}::{rest}" if rest else str((config.rootpath / path).resolve())
    cmd = [
        "-m",
        "pytest",
        node,
        "-p",
        "hctool.pytest_plugin",
        "--hctool-worker",
        trace_dir,
        "--hctool-backend",
        backend,
        "--hctool-timeout",
        str(timeout),
        "--hctool-hang-after",
        str(hang_after),
        "--rootdir",
        str(config.rootpath),
        "-o",
        "addopts=",
        "-p",
        "no:cacheprovider",
        "-s",
        "-q",
        "--no-header",
        "-rN",
    ]
    if config.inipath is not None:
        cmd += ["-c", str(config.inipath)]
    return cmd + _forwarded(config.invocation_params.args)


def _forwarded(args) -> list[str]:
    """Options of the user's pytest command line that change how a test file is
    imported or which plugins exist: the ranks must see the same."""
    out, args = [], list(args)
    for i, a in enumerate(args):
        nxt = args[i + 1] if i + 1 < len(args) else ""
        if a == "-p" and nxt and nxt != "hctool.pytest_plugin":
            out += ["-p", nxt]
        elif a.startswith("-p") and len(a) > 2 and a[2:] != "hctool.pytest_plugin":
            out += ["-p", a[2:]]
        elif a.startswith("--import-mode="):
            out.append(a)
        elif a == "--import-mode" and nxt:
            out += [a, nxt]
    return out


def _gpus(n: int) -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class Outcome(NamedTuple):
    status: str  # "passed", "skipped" or "failed"
    message: str = ""


def run_on_ranks(item: pytest.Function, marker) -> None:
    from hctool.consensus.run import RunOptions, run_job
    from hctool.protocol.runrecord import RunRecord

    n, timeout, hang_after, backend = _marker_args(item, marker)
    if backend == "nccl" and _gpus(n) < n:
        pytest.skip(f"--hctool-backend nccl needs {n} GPU(s), found {_gpus(n)}")
    trace_dir = tempfile.mkdtemp(prefix="hctool-ranks-")
    opts = RunOptions(
        command=_rank_command(item, trace_dir, backend, timeout, hang_after),
        nproc=n,
        timeout=timeout,
        hang_after=hang_after,
        abort=True,
        trace_dir=Path(trace_dir),
        script_mode=True,
    )
    report, latency = run_job(opts)
    codes = RunRecord.read(Path(trace_dir)).exit_codes
    outcome = _outcome(report, read_outcomes(trace_dir), codes, trace_dir, n, timeout)
    if outcome.status != "failed":
        shutil.rmtree(trace_dir, ignore_errors=True)
        if outcome.status == "skipped":
            pytest.skip(outcome.message)
        return
    message = outcome.message
    if latency is not None and report.verdict is not Verdict.CONSISTENT:
        message += f"\n(detected {latency:.1f} s after the divergent call)"
    pytest.fail(f"{message}\n(rank logs and traces kept in {trace_dir})", pytrace=False)


def _outcome(
    report: Report,
    outcomes: dict[int, list[dict]],
    codes: dict[int, int | None],
    trace_dir: str,
    n: int,
    timeout: float,
) -> Outcome:
    """What the ranks did, as this test's outcome."""
    failed = sorted((e for es in outcomes.values() for e in es if e["outcome"] == "failed"), key=lambda e: e["t"])
    verdict = report.verdict.value
    if not failed and verdict == "consistent" and len(codes) == n and all(c == 0 for c in codes.values()):
        skipped = {e["rank"]: e for es in outcomes.values() for e in es if e["outcome"] == "skipped"}
        if len(skipped) == n:
            return Outcome("skipped", skipped[min(skipped)].get("reason") or "skipped on every rank")
        if skipped:
            return Outcome(
                "failed",
                f"rank(s) {sorted(skipped)} skipped the test while the others ran it (a rank-local skip condition)",
            )
        return Outcome("passed")
    parts: list[str] = []
    if failed:
        first = failed[0]
        others = sorted({e["rank"] for e in failed[1:]} - {first["rank"]})
        parts.append(
            f"rank {first['rank']} of {n} failed in {first['when']}"
            + (f" (then rank(s) {', '.join(map(str, others))} failed too)" if others else "")
            + ":"
        )
        parts.append(first["longrepr"])
    for r, c in sorted(codes.items()):
        if c not in (0, None) and not outcomes.get(r):
            parts.append(
                f"rank {r} died ({_describe(c)}) before reporting; last lines of its log:\n"
                + _tail(Path(trace_dir) / f"rank{r}.log")
            )
    if failed and verdict != "consistent":  # the traceback is the news; the collectives give context
        from hctool.consensus.report import counts_line

        cause = f"\n{report.first_divergence.cause_line()}" if report.first_divergence else ""
        parts.append(f"collectives at that point ({verdict}):{cause}\n" + _sites(report) + "\n" + counts_line(report))
    elif verdict != "consistent" or not parts:
        parts += [_headline(report, codes, timeout), _sites(report), _render(report)]
    return Outcome("failed", "\n".join(p for p in parts if p))


def _headline(report: Report, codes: dict[int, int | None], timeout: float) -> str:
    """The answer first: the cause and the culprit, then where the ranks stopped."""
    first = report.first_divergence
    alive = [str(r) for r, c in sorted(codes.items()) if c is None]
    if first is not None:
        lead = {"hung": "ranks hung", "crashed": "a rank crashed"}.get(report.verdict.value, "ranks diverged")
        return f"{lead}: {first.cause_line()}\n{first.symptom_line()}".rstrip()
    if report.verdict is Verdict.CRASHED:
        return "a rank crashed while its peers were in a collective"
    if alive:
        return f"ranks did not finish within {timeout:.0f} s (rank(s) {', '.join(alive)} still running): their stacks"
    return f"the ranks' collectives: {report.headline()}"


def _describe(code: int | None) -> str:
    from hctool.supervise.procs import describe_exit

    return describe_exit(code)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _sites(report: Report) -> str:
    """One plain line per rank: readable in any CI log, even where tables wrap."""
    first = report.first_divergence
    if not first:
        return ""
    return "\n".join(
        f"  rank {r}: {e.op or '-'} @ {e.site or '-'} ({e.function or '-'}) [{e.state}]" for r, e in first.ranks.items()
    )


def _render(report: Report) -> str:
    # A stack without a Python frame (a rank already leaving) only adds noise.
    from dataclasses import replace

    from rich.console import Console

    from hctool.consensus.report import render

    stacks = {r: t for r, t in report.stacks.items() if _FRAME.search(t)}
    buf = io.StringIO()
    render(replace(report, stacks=stacks), Console(file=buf, width=160, color_system=None, soft_wrap=True))
    return buf.getvalue()
