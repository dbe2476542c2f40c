"""The plugin's side in the pytest process that collected a multi-rank test:
start one pytest per rank on the same test id with the recorder injected
(hctool.consensus.run.run_job watches the traces live, takes stacks and reaps
every process), then turn what the ranks did into this test's outcome."""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import pytest

from hctool.consensus.model import Kind, Report, Verdict
from hctool.pytest_plugin import frames
from hctool.pytest_plugin.failure import Failure, RanksFailed
from hctool.pytest_plugin.worker import read_outcomes

_PROGRESS = re.compile(r"^[.FEsxX]+\s*$")  # the rank pytest's own progress letters


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
    return cmd + _traceback_options(config) + _forwarded(config.invocation_params.args)


def _traceback_options(config: pytest.Config) -> list[str]:
    """How a rank renders its traceback: the long forms as asked; short, line and no are
    composed here from the rank's crash line, and the JUnit text keeps the long form."""
    style = config.getoption("tbstyle", "auto")
    out = [f"--tb={style}"] if style in ("long", "native") else []
    if config.getoption("showlocals", False):
        out.append("--showlocals")
    if config.getoption("fulltrace", False):
        out.append("--full-trace")  # every frame: the worker then hides none
    return out


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


class RankRun(NamedTuple):
    """What the controller knows of the ranks once they are done."""

    report: Report
    outcomes: dict[int, list[dict]]  # each rank's phase entries (worker.py)
    codes: dict[int, int | None]  # exit codes; None: still running at the end
    trace_dir: str
    n: int
    timeout: float
    latency: float | None  # seconds from the divergent call to its detection


@contextlib.contextmanager
def _quiet_hctool():
    """run_job's progress and its tails of the rank logs went to the test's captured stderr,
    a second copy of what the failure says: the failure alone speaks (warnings still pass)."""
    from hctool.console.log import get

    logger = get()
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


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
    with _quiet_hctool():
        report, latency = run_job(opts)
    codes = RunRecord.read(Path(trace_dir)).exit_codes
    run = RankRun(report, read_outcomes(trace_dir), codes, trace_dir, n, timeout, latency)
    outcome = _outcome(run)
    if outcome.status != "failed":
        shutil.rmtree(trace_dir, ignore_errors=True)
        if outcome.status == "skipped":
            pytest.skip(outcome.message)
        return
    if outcome.message:  # a rank-local skip: one line says it all
        path, line = _test_location(item)
        raise RanksFailed(Failure(outcome.message, outcome.message, outcome.message, path, line))
    raise RanksFailed(_failure(item, run))


def _outcome(run: RankRun) -> Outcome:
    """Passed, skipped, or failed (with a message only where no report needs composing)."""
    failed = [e for es in run.outcomes.values() for e in es if e["outcome"] == "failed"]
    codes = run.codes
    clean = len(codes) == run.n and all(c == 0 for c in codes.values())
    if failed or run.report.verdict is not Verdict.CONSISTENT or not clean:
        return Outcome("failed")
    skipped = {e["rank"]: e for es in run.outcomes.values() for e in es if e["outcome"] == "skipped"}
    if len(skipped) == run.n:
        return Outcome("skipped", skipped[min(skipped)].get("reason") or "skipped on every rank")
    if skipped:
        return Outcome(
            "failed",
            f"rank(s) {sorted(skipped)} skipped the test while the others ran it (a rank-local skip condition)",
        )
    return Outcome("passed")


def _failure(item: pytest.Function, run: RankRun) -> Failure:
    """The answer first (the cause and the culprit, then where each rank stopped), in the three
    lengths --tb picks from."""
    report, n = run.report, run.n
    failed = sorted((e for es in run.outcomes.values() for e in es if e["outcome"] == "failed"), key=lambda e: e["t"])
    first = failed[0] if failed else None
    failed_ranks = {e["rank"] for e in failed}
    dead = {r: c for r, c in sorted(run.codes.items()) if c not in (0, None) and not run.outcomes.get(r)}
    div = report.first_divergence
    # The exception is the news unless the collectives explain it: a rank that raised and left is
    # "missing" from its peers' next call (a consequence); a shape mismatch is the cause of the
    # "connection reset" its peer then raises.
    exception_leads = first is not None and (
        div is None or (div.kind is Kind.MISSING and set(div.culprit_ranks) <= failed_ranks | set(dead))
    )
    lead: list[str] = []
    if exception_leads:
        assert first is not None
        lead.append(f"rank {first['rank']} of {n} failed in {first['when']}: {_exception_line(first)}")
        if div is not None:
            lead.append(div.cause_line())
    elif div is not None:
        verb = {"hung": "ranks hung", "crashed": "a rank crashed"}.get(report.verdict.value, "ranks diverged")
        lead.append(f"{verb}: {div.cause_line()}")
    else:
        lead.append(_headline(report, run, dead))
    if div is not None and div.symptom_line():
        lead.append(div.symptom_line())
    headline = "; ".join(lead[:2]) if exception_leads else lead[0]

    stacks = {r: frames.trim(t, keep_other_lines=False) for r, t in _rank_keyed(report.stacks).items()}
    per_rank = _frame_per_rank(run, div, failed, dead, stacks)
    if first is not None and not exception_leads and _symptom_state(div, first["rank"]) != "failed":
        per_rank.append(f"rank {first['rank']} of {n} failed first, in {first['when']}: {_exception_line(first)}")
    kept = f"(rank logs and traces kept in {run.trace_dir})"
    short = "\n".join([*lead, *per_rank, kept])

    long = [*lead, *per_rank]
    if div is not None:
        long.append(f"confidence {div.confidence.value}" + (f": {div.basis}" if div.basis else ""))
    if report.counts:
        from hctool.consensus.report import counts_line

        long.append(counts_line(report))
    if first is not None:
        long.append(f"--- rank {first['rank']} failed in {first['when']} ---")
        long.append(first.get("longrepr", "").rstrip())
        if first.get("hidden"):
            long.append(frames.hidden_line(first["hidden"]))
    shown = _shown_ranks(run, div, failed_ranks, dead)
    for r in shown:
        text = stacks.get(r, ("", []))[0]
        if text.strip() and stacks[r][1]:  # a stack with no frame of the user's (a rank leaving) says nothing
            long += [f"--- stack of rank {r} ---", text]
    for r in shown:
        tail = _log_tail(Path(run.trace_dir) / f"rank{r}.log")
        if tail:
            long += [f"--- last lines of rank {r}'s log ---", tail]
    if run.latency is not None and report.verdict is not Verdict.CONSISTENT:
        long.append(f"(detected {run.latency:.1f} s after the divergent call)")
    long.append(kept)
    path, line = _crash_location(item, first if exception_leads else None, div)
    return Failure(headline, short, "\n".join(long), path, line)


def _symptom_state(div, rank: int) -> str | None:
    symptom = div.symptom.get(rank) if div is not None else None
    return symptom.state if symptom is not None else None


def _exception_line(entry: dict, limit: int = 300) -> str:
    """The exception's first line (`ValueError: rank one is broken`), where the user's code raised it."""
    if entry.get("exception"):
        first = entry["exception"].strip().splitlines()[0]
    else:  # a failure with no exception of its own (a strict xfail that passed): pytest's last line
        first = ((entry.get("longrepr") or "").strip().splitlines() or ["(no traceback)"])[-1]
    first = first if len(first) <= limit else first[: limit - 3] + "..."
    crash = entry.get("crash")
    return f"{first} (at {crash['path']}:{crash['line']} in {crash['func']})" if crash else first


def _frame_per_rank(
    run: RankRun, div, failed: list[dict], dead: dict[int, int | None], stacks: dict[int, tuple]
) -> list[str]:
    """One line per rank: its divergent call, else where it failed, died or stopped."""
    first_failure = {}
    for e in failed:
        first_failure.setdefault(e["rank"], e)
    lines = []
    for r in range(run.n):
        call = div.ranks.get(r) if div is not None else None
        if call is not None and call.state != "absent":
            args = call.describe().removeprefix(call.op or "").strip()
            lines.append(
                f"  rank {r}: {call.op or '-'} @ {call.site or '-'} ({call.function or '-'}) [{call.state}]"
                + (f" {args}" if args else "")
            )
        elif r in first_failure:
            e = first_failure[r]
            lines.append(f"  rank {r}: failed in {e['when']}: {_exception_line(e)}")
        elif r in dead:
            lines.append(f"  rank {r}: died ({_describe(dead[r])}) before reporting")
        elif r in stacks and stacks[r][1]:
            lines.append(f"  rank {r}: at {stacks[r][1][0].where()}")
        elif call is not None:
            lines.append(f"  rank {r}: absent" + (f" (last: {call.last_seen})" if call.last_seen else ""))
    return lines


MANY = 8  # beyond this many ranks, the stacks and logs of the ranks the answer names only


def _shown_ranks(run: RankRun, div, failed_ranks: set[int], dead: dict) -> list[int]:
    if run.n <= MANY:
        return list(range(run.n))
    named = set(div.culprit_ranks if div is not None else ()) | failed_ranks | set(dead)
    return sorted(named) or [0]


def _rank_keyed(stacks: dict[str, str]) -> dict[int, str]:
    return {int(r): t for r, t in stacks.items() if str(r).isdigit()}


def _log_tail(path: Path, lines: int = 12) -> str:
    """The last lines of a rank's log, its dumps trimmed to the user's frames, without the rank
    pytest's progress letters."""
    from hctool.console.paths import tidy_stack_text

    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    trimmed, _ = frames.trim(tidy_stack_text(text), keep_other_lines=True)
    kept = [ln for ln in trimmed.splitlines() if not _PROGRESS.match(ln)]
    while kept and not kept[-1].strip():
        kept.pop()
    return "\n".join(kept[-lines:])


def _test_location(item: pytest.Function) -> tuple[str, int]:
    path, line0, _ = item.location
    return path, (line0 or 0) + 1


def _crash_location(item: pytest.Function, crash_entry: dict | None, div) -> tuple[str, int]:
    """Where `--tb=line` points: the raising line of the user's code, else the cause's call site
    where it is in the test's own file, else the test."""
    path, line = _test_location(item)
    if crash_entry is not None and crash_entry.get("crash"):
        return crash_entry["crash"]["path"], int(crash_entry["crash"]["line"])
    site = div.cause.call.site if div is not None and div.cause is not None else None
    if site and ":" in site:
        name, _, number = site.rpartition(":")
        if number.isdigit() and name == Path(path).name:
            return path, int(number)
    return path, line


def _headline(report: Report, run: RankRun, dead: dict[int, int | None]) -> str:
    """Without a divergence or an exception: what ended the test."""
    alive = [str(r) for r, c in sorted(run.codes.items()) if c is None]
    if dead:
        how = "; ".join(f"rank {r} of {run.n} died ({_describe(c)}) before reporting" for r, c in dead.items())
        return how + (", while its peers were in a collective" if report.verdict is Verdict.CRASHED else "")
    if report.verdict is Verdict.CRASHED:
        return "a rank crashed while its peers were in a collective"
    if alive:
        return (
            f"ranks did not finish within {run.timeout:.0f} s (rank(s) {', '.join(alive)} still running): their stacks"
        )
    return f"the ranks' collectives: {report.headline()}"


def _describe(code: int | None) -> str:
    from hctool.supervise.procs import describe_exit

    return describe_exit(code)
